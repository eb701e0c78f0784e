"""Errors a person can act on: bad input (``ValueError``, ``OSError``, a non-finite loss, a
corrupt safetensors file) ends a command or stage with one line naming the file and the
reason; anything else is a bug and keeps its traceback (``MINBERT_DEBUG=1``/``--debug``
shows it always)."""

from __future__ import annotations

import contextlib
import os
import sys


def _reported() -> tuple[type[BaseException], ...]:
    from safetensors import SafetensorError

    return (ValueError, OSError, FloatingPointError, SafetensorError)


@contextlib.contextmanager
def report_errors(debug: bool | None = None):
    """Turn a reported error into ``error: <message>`` on stderr and exit status 1."""
    if debug is None:
        debug = os.environ.get("MINBERT_DEBUG", "") not in ("", "0")
    try:
        yield
    except _reported() as exc:
        if debug:
            raise
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        message = "; ".join(lines) or exc.__class__.__name__
        # One line, whatever the message held: `minbert --debug` / MINBERT_DEBUG=1 show
        # the traceback instead (README, `minbert --help`).
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(1) from None


# What an interrupted stage leaves: its outputs are written only when it ends, and a
# training stage saves its whole state after every epoch (minbert.train.resume).
INTERRUPTED = (
    "interrupted: no output of this stage was written; a training stage keeps the state of "
    "its last finished epoch in .resume/, and `dvc repro` continues from there"
)


def reported(fn):
    """A stage's entry function whose bad-input errors end in one line (see above), and
    whose interruption (Ctrl-C) ends in one line saying what was kept."""
    import functools

    @functools.wraps(fn)
    def run(*args, **kwargs):
        try:
            with report_errors():
                return fn(*args, **kwargs)
        except KeyboardInterrupt:
            if os.environ.get("MINBERT_DEBUG", "") not in ("", "0"):
                raise
            print(INTERRUPTED, file=sys.stderr)
            raise SystemExit(130) from None

    return run
