"""Where checkpoints come from: packaged, local directory, hub download (on loopback)."""

from __future__ import annotations

import functools
import http.server
import shutil
import threading

import pytest
import torch

from minbert.model import BertModel
from minbert.model import checkpoint as ck


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


@pytest.fixture
def hub(tmp_path, tiny_checkpoint, monkeypatch):
    """A loopback HTTP server laid out like the hub's resolve URLs."""
    served = tmp_path / "served" / "org" / "tiny-bert" / "resolve" / "main"
    served.mkdir(parents=True)
    for f in ("config.json", "vocab.txt", "model.safetensors"):
        shutil.copy(tiny_checkpoint / f, served / f)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "served"))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(ck, "HUB_URL", f"http://127.0.0.1:{server.server_port}/{{name}}/resolve/{{revision}}/{{file}}")
    yield served
    server.shutdown()
    server.server_close()


def test_hub_name_is_downloaded_once_and_loads(hub, tmp_path, tiny_checkpoint):
    cache = tmp_path / "cache"
    directory = ck.resolve_checkpoint("org/tiny-bert", cache=cache)
    assert directory == cache / "checkpoints" / "org--tiny-bert" / "main"
    model = BertModel.from_pretrained(directory)
    reference = BertModel.from_pretrained(tiny_checkpoint)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values()))
    # A second resolution uses the cache: the server may be gone.
    (hub / "model.safetensors").unlink()
    assert ck.resolve_checkpoint("org/tiny-bert", cache=cache) == directory


def test_hub_without_weights_fails_cleanly(hub, tmp_path):
    (hub / "model.safetensors").unlink()
    with pytest.raises(ck.CheckpointError, match="could not download weights of 'org/tiny-bert'"):
        ck.resolve_checkpoint("org/tiny-bert", cache=tmp_path / "cache")
    target = tmp_path / "cache" / "checkpoints" / "org--tiny-bert" / "main"
    assert not any(target.glob("*.safetensors")) and not any(target.glob("*.bin"))
