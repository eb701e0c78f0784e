"""Device choice, mixed precision and the device-specific choices of a step.

CUDA when present, else CPU. On CUDA the forward pass runs under bf16 autocast
(master weights and optimizer states stay fp32) with chosen attention kernels, and
batches are padded to repeating widths; on the CPU bf16 measured no faster here, so
it runs in fp32, padded only to each batch's longest sequence.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch

from minbert.settings import DEVICES

# The CPU code paths every stage runs with, so that CPUs of different generations add
# floating-point numbers in the same order: torch's own vectorised kernels at AVX2 (not
# AVX-512 where a CPU has it) and MKL's matrix products in its AVX2 "conditional
# numerical reproducibility" branch, which MKL honours on Intel CPUs only: an AMD EPYC
# takes its own paths, and its bits differ from an Intel's (docs/performance.md).
# Measured on the project's 2-core AMD EPYC machine: the same bits as without the
# pins; torch's generic kernels instead change the 7th decimal. Set either variable
# yourself to override.
CPU_KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}


def pin_cpu_kernels() -> None:
    """Fix the CPU code paths (``CPU_KERNELS``) on x86 CPUs with AVX2. Must run before
    the first tensor operation: torch and MKL read these variables once, then."""
    cpuinfo = Path("/proc/cpuinfo")
    flags = cpuinfo.read_text(errors="replace") if cpuinfo.is_file() else ""
    if " avx2" in flags:
        for name, value in CPU_KERNELS.items():
            os.environ.setdefault(name, value)


def choose_device(name: str = "auto") -> torch.device:
    """A name of ``DEVICES``, or one with an index (``cuda:1``: the second GPU)."""
    kind, _, index = name.partition(":")
    if kind not in DEVICES or (index and (kind == "auto" or not index.isdigit())):
        raise ValueError(f"device {name!r} is not one of {list(DEVICES)} (or cpu:N, cuda:N)")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was asked for, but torch sees no CUDA device")
    return torch.device(name)


# Attention kernels allowed on CUDA, best first. cuDNN's is left out: it builds a new
# execution plan for every new sequence length, which costs milliseconds of host
# time per call when length-bucketed batches change shape from step to step.
CUDA_ATTENTION = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
# On CUDA, batches are padded up to a multiple of this many tokens, so that the
# shapes a step sees repeat (a few dozen widths instead of one per length); on the
# CPU every padded position costs compute, so batches stay at their longest.
CUDA_PAD_MULTIPLE = 32


def compute_context(device: torch.device):
    """What every forward pass runs under: on CUDA, bf16 autocast with the attention
    kernels of ``CUDA_ATTENTION``; nothing on the CPU."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    stack = contextlib.ExitStack()
    stack.enter_context(torch.autocast("cuda", dtype=torch.bfloat16))
    stack.enter_context(
        sdpa_kernel([getattr(SDPBackend, name) for name in CUDA_ATTENTION], set_priority=True)
    )
    return stack


def pad_multiple(device: torch.device) -> int:
    """Padded batch widths are a multiple of this (see ``CUDA_PAD_MULTIPLE``)."""
    return CUDA_PAD_MULTIPLE if device.type == "cuda" else 1


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32, whatever autocast made it; a float64 tensor (a reference
    computation, ``bench/ascent_precision.py``) stays float64."""
    return x if x.dtype == torch.float64 else x.float()


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device``; to CUDA through pinned memory without making the
    host wait for the copy."""
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return f"cpu ({torch.get_num_threads()} threads)"
