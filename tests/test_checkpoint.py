"""Where checkpoints come from: packaged, local directory, hub download (on loopback)."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from minbert.model import checkpoint as ck
from minbert.model.bert import BertModel


def test_packaged_checkpoint_resolves(minilm_dir):
    assert (minilm_dir / "model.safetensors").is_file()
    assert ck.resolve_checkpoint("all-minilm-l6-v2") == minilm_dir


def test_local_directory_and_its_errors(tiny_checkpoint, tmp_path):
    assert ck.resolve_checkpoint(str(tiny_checkpoint)) == tiny_checkpoint
    with pytest.raises(ck.CheckpointError, match="does not exist"):
        ck.resolve_checkpoint(str(tmp_path / "nowhere"))
    partial = tmp_path / "partial"
    partial.mkdir()
    shutil.copy(tiny_checkpoint / "config.json", partial)
    with pytest.raises(ck.CheckpointError, match="lacks vocab.txt, model.safetensors or pytorch_model.bin"):
        ck.resolve_checkpoint(str(partial))
    with pytest.raises(ck.CheckpointError, match="neither a packaged checkpoint"):
        ck.resolve_checkpoint("bert-base-uncased")


class FakeHub(http.server.BaseHTTPRequestHandler):
    """The few endpoints of the Hugging Face hub that ``huggingface_hub`` downloads a
    snapshot through: a revision's commit, its file tree, and each file (HEAD and GET)."""

    repos: dict[str, dict[str, dict[str, bytes]]] = {}  # repo -> revision -> file -> bytes
    requests: list[tuple[str, str, str | None]] = []  # method, path, Authorization header

    def log_message(self, *args):
        pass

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _route(self, head: bool):
        self.requests.append((self.command, self.path, self.headers.get("Authorization")))
        path = self.path.split("?")[0].strip("/").split("/")
        if path[:2] == ["api", "models"] and len(path) >= 6:
            repo, kind, revision = "/".join(path[2:4]), path[4], path[5]
            revisions = self.repos.get(repo, {})
            commit = next((c for c, (r, _) in _commits(revisions).items() if revision in (r, c)), None)
            if commit is None:
                return self._send(404, b"{}", {"X-Error-Code": "RevisionNotFound"}, head)
            files = revisions[_commits(revisions)[commit][0]]
            if kind == "revision":
                body = {"id": repo, "sha": commit, "siblings": [{"rfilename": f} for f in files]}
            else:
                body = [
                    {"type": "file", "path": f, "size": len(d), "oid": hashlib.sha1(d).hexdigest()}
                    for f, d in files.items()
                ]
            return self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"}, head)
        if len(path) >= 5 and path[2] == "resolve":
            repo, revision, name = "/".join(path[:2]), path[3], "/".join(path[4:])
            for commit, (rev, files) in _commits(self.repos.get(repo, {})).items():
                if revision in (rev, commit) and name in files:
                    data = files[name]
                    headers = {
                        "X-Repo-Commit": commit,
                        "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                        "Content-Type": "application/octet-stream",
                    }
                    return self._send(200, data, headers, head)
            return self._send(404, b"", {"X-Error-Code": "EntryNotFound"}, head)
        return self._send(404, b"", {}, head)

    def do_GET(self):
        self._route(head=False)

    def do_HEAD(self):
        self._route(head=True)


def _commits(revisions: dict) -> dict[str, tuple[str, dict]]:
    """A stable 40-hex commit id per revision name."""
    return {hashlib.sha1(r.encode()).hexdigest(): (r, files) for r, files in revisions.items()}


@pytest.fixture
def hub(tiny_checkpoint):
    """A loopback hub holding `org/tiny-bert` (main: safetensors; v1: pytorch_model.bin;
    empty: no weights)."""
    files = {f: (tiny_checkpoint / f).read_bytes() for f in ("config.json", "vocab.txt", "model.safetensors")}
    state = ck.read_state_dict(tiny_checkpoint)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    old = {
        "config.json": files["config.json"],
        "vocab.txt": files["vocab.txt"],
        "pytorch_model.bin": buffer.getvalue(),
    }
    FakeHub.repos = {
        "org/tiny-bert": {
            "main": files,
            "v1": old,
            "empty": {"config.json": files["config.json"], "vocab.txt": files["vocab.txt"]},
        }
    }
    FakeHub.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", server
    server.shutdown()
    server.server_close()


def _resolve(name: str, revision: str, env: dict) -> subprocess.CompletedProcess:
    """`minbert checkpoint NAME --revision R` in a fresh process (huggingface_hub reads its
    environment when imported)."""
    code = (
        "import sys; from minbert.model.checkpoint import resolve_checkpoint; "
        "print(resolve_checkpoint(sys.argv[1], revision=sys.argv[2]))"
    )
    return subprocess.run(
        [sys.executable, "-c", code, name, revision],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_DISABLE_TELEMETRY": "1", **env},
        timeout=120,
    )


@pytest.mark.slow
def test_hub_checkpoint_through_huggingface_hub(hub, tmp_path, tiny_checkpoint):
    endpoint, server = hub
    env = {"HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf"), "HF_TOKEN": "hf_test_token"}
    done = _resolve("org/tiny-bert", "main", env)
    assert done.returncode == 0, done.stderr
    directory = Path(done.stdout.strip())
    # The Hugging Face cache layout, at the revision's commit.
    main_commit = next(c for c, (r, _) in _commits(FakeHub.repos["org/tiny-bert"]).items() if r == "main")
    assert directory == tmp_path / "hf" / "hub" / "models--org--tiny-bert" / "snapshots" / main_commit
    model, reference = BertModel.from_pretrained(directory), BertModel.from_pretrained(tiny_checkpoint)
    assert all(
        torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values())
    )
    # The token went with every request to the hub.
    assert FakeHub.requests and all(
        auth == "Bearer hf_test_token" for _, path, auth in FakeHub.requests if "tiny-bert" in path
    )
    # Offline, with the server gone: the cached snapshot.
    server.shutdown()
    offline = _resolve("org/tiny-bert", "main", {**env, "HF_HUB_OFFLINE": "1"})
    assert offline.returncode == 0 and Path(offline.stdout.strip()) == directory, offline.stderr
    # Offline and never downloaded: a clear error, no network.
    missing = _resolve("org/tiny-bert", "v1", {**env, "HF_HUB_OFFLINE": "1"})
    assert missing.returncode != 0 and "not in the Hugging Face cache" in missing.stderr


@pytest.mark.slow
def test_hub_revision_pins_and_falls_back_to_pytorch_weights(hub, tmp_path, tiny_checkpoint):
    endpoint, _ = hub
    env = {"HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf")}
    done = _resolve("org/tiny-bert", "v1", env)
    assert done.returncode == 0, done.stderr
    directory = Path(done.stdout.strip())
    assert (directory / "pytorch_model.bin").is_file() and not (directory / "model.safetensors").exists()
    state, reference = ck.read_state_dict(directory), ck.read_state_dict(tiny_checkpoint)
    assert all(torch.equal(state[k], reference[k]) for k in reference)
    # A revision without weights, or one that does not exist: clean errors.
    empty = _resolve("org/tiny-bert", "empty", env)
    assert empty.returncode != 0 and "has neither model.safetensors nor pytorch_model.bin" in empty.stderr
    absent = _resolve("org/tiny-bert", "v9", env)
    assert (
        absent.returncode != 0
        and "could not download checkpoint 'org/tiny-bert' at revision 'v9'" in absent.stderr
    )
