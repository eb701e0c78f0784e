"""Device choice and mixed precision.

CUDA when present, else CPU. On CUDA the forward pass runs under bf16 autocast
(master weights and optimizer states stay fp32); on the CPU bf16 measured no faster
here, so it runs in fp32.
"""

from __future__ import annotations

import contextlib

import torch

DEVICES = ("auto", "cpu", "cuda")


def choose_device(name: str = "auto") -> torch.device:
    if name not in DEVICES:
        raise ValueError(f"device {name!r} is not one of {list(DEVICES)}")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for, but torch sees no CUDA device")
    return torch.device(name)


def autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return f"cpu ({torch.get_num_threads()} threads)"
