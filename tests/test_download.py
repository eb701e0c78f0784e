"""Downloading course files (minbert.data.download) against a local HTTP server."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pandas as pd
import pytest
from coursefiles import UNVERIFIED, course_files

from minbert.data import download
from minbert.data.download import DownloadError, fetch, sha256_file
from minbert.data.prepare import prepare


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    """Serves `server.files` by name; names in `server.cut_off` announce more
    bytes than they send, like a connection dropped mid-transfer."""

    def do_GET(self):
        name = self.path.rsplit("/", 1)[-1]
        body = self.server.files.get(name)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body) + (1000 if name in self.server.cut_off else 0)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):  # keep pytest output quiet
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.files, httpd.cut_off = {}, set()
    # A short poll interval so shutdown() at teardown returns at once.
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    httpd.url = f"http://127.0.0.1:{httpd.server_port}/data"
    yield httpd
    httpd.shutdown()
    httpd.server_close()
    thread.join()


BODY = b"\tid\tsentence\tsentiment\n0\ta\t x\t1\n" * 1000


def test_fetch_writes_file_and_returns_checksum(tmp_path, server):
    server.files["a.csv"] = BODY
    dest = tmp_path / "raw" / "a.csv"
    assert fetch(f"{server.url}/a.csv", dest, sha(BODY)) == sha(BODY)
    assert dest.read_bytes() == BODY
    assert sha256_file(dest) == sha(BODY)
    assert [p.name for p in dest.parent.iterdir()] == ["a.csv"]


def test_fetch_without_known_checksum_returns_the_computed_one(tmp_path, server):
    server.files["a.csv"] = BODY
    assert fetch(f"{server.url}/a.csv", tmp_path / "a.csv", None) == sha(BODY)


def test_checksum_mismatch_leaves_nothing_and_names_file_and_both_checksums(tmp_path, server):
    server.files["a.csv"] = BODY
    wrong = "0" * 64
    with pytest.raises(DownloadError) as err:
        fetch(f"{server.url}/a.csv", tmp_path / "a.csv", wrong)
    message = str(err.value)
    assert "a.csv" in message and wrong in message and sha(BODY) in message
    assert list(tmp_path.iterdir()) == []


def test_failed_fetch_keeps_an_existing_destination(tmp_path, server):
    server.files["a.csv"] = BODY
    dest = tmp_path / "a.csv"
    dest.write_bytes(b"old")
    with pytest.raises(DownloadError):
        fetch(f"{server.url}/a.csv", dest, "0" * 64)
    assert dest.read_bytes() == b"old" and list(tmp_path.iterdir()) == [dest]


def test_cut_off_transfer_leaves_nothing(tmp_path, server):
    server.files["a.csv"] = BODY
    server.cut_off.add("a.csv")
    with pytest.raises(DownloadError) as err:
        fetch(f"{server.url}/a.csv", tmp_path / "a.csv", None)
    message = str(err.value)
    assert "a.csv" in message and "cut off" in message
    assert f"received {len(BODY)} bytes of the {len(BODY) + 1000}" in message
    assert list(tmp_path.iterdir()) == []


def test_http_error_leaves_nothing(tmp_path, server):
    with pytest.raises(DownloadError, match="HTTP 404"):
        fetch(f"{server.url}/missing.csv", tmp_path / "missing.csv", None)
    assert list(tmp_path.iterdir()) == []


def test_unreachable_server_is_a_download_error(tmp_path):
    with socket.socket() as sock:  # a port that nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(DownloadError, match="cannot download a.csv"):
        fetch(f"http://127.0.0.1:{port}/a.csv", tmp_path / "a.csv", None, timeout=5)
    assert list(tmp_path.iterdir()) == []


def _serve_course(server, monkeypatch, files: dict[str, bytes]) -> None:
    """Serve `files` and make them the known course files (the unverified
    Quora files keep their unknown checksum)."""
    server.files.update(files)
    for name, body in files.items():
        if name not in UNVERIFIED:
            monkeypatch.setitem(download.COURSE_SHA256, name, sha(body))


PREPARE_ARGS = dict(quora_holdout_fraction=0.2, split_seed=7, skip_ids={})


def test_prepare_downloads_into_raw_and_carves_quora(tmp_path, server, monkeypatch):
    files = course_files(30)
    _serve_course(server, monkeypatch, files)
    out = tmp_path / "prepared"
    manifest = prepare("download", out, base_url=server.url, **PREPARE_ARGS)

    assert {p.name for p in (out / "raw").iterdir()} == set(files)
    for name, body in files.items():
        assert (out / "raw" / name).read_bytes() == body
    assert manifest["source"]["kind"] == "download"
    assert manifest["source"]["url"] == f"{server.url}/{{name}}"
    assert manifest["source"]["commit"] == download.COURSE_COMMIT
    assert {i["file"]: (i["sha256"], i["verified"]) for i in manifest["inputs"]} == {
        name: (sha(body), True) for name, body in files.items()
    }
    # Unknown checksums are not downloaded unless asked for.
    assert sorted(u["file"] for u in manifest["unavailable"]) == sorted(UNVERIFIED)
    assert manifest["quora_split"]["kind"] == "carved-from-dev"
    assert not (out / "quora-test.parquet").exists()
    assert json.loads((out / "manifest.json").read_text()) == manifest


def test_prepare_downloads_unverified_files_only_when_allowed(tmp_path, server, monkeypatch):
    files = course_files(30, unverified_too=True)
    _serve_course(server, monkeypatch, files)
    out = tmp_path / "prepared"
    manifest = prepare("download", out, base_url=server.url, allow_unverified=True, **PREPARE_ARGS)

    inputs = {i["file"]: i for i in manifest["inputs"]}
    for name in UNVERIFIED:
        assert inputs[name] == {"file": name, "sha256": sha(files[name]), "verified": False}
    assert manifest["unavailable"] == []
    assert manifest["quora_split"] == {"kind": "official"}
    assert len(pd.read_parquet(out / "quora-train.parquet")) == 30
    assert "label" not in pd.read_parquet(out / "quora-test.parquet").columns


def test_prepare_with_a_bad_download_leaves_no_output(tmp_path, server, monkeypatch):
    files = course_files(30)
    _serve_course(server, monkeypatch, files)
    server.files["sts-dev.csv"] = files["sts-dev.csv"] + b"tampered"
    with pytest.raises(DownloadError, match="sts-dev.csv"):
        prepare("download", tmp_path / "prepared", base_url=server.url, **PREPARE_ARGS)
    assert list(tmp_path.iterdir()) == []
