"""The paper-scale epoch benchmark's profiler summary (bench/paper_epoch.py), on events
shaped as torch.profiler's ``key_averages()`` gives them on a GPU."""

import sys
from pathlib import Path
from types import SimpleNamespace

from torch.autograd import DeviceType

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import paper_epoch  # noqa: E402


def _event(key, device_type, count, cpu_us=0.0, device_us=0.0, annotation=False):
    return SimpleNamespace(
        key=key,
        device_type=device_type,
        count=count,
        self_cpu_time_total=cpu_us,
        self_device_time_total=device_us,
        is_user_annotation=annotation,
    )


def test_device_time_counts_each_kernel_once():
    """An operator's self device time is its kernels' time, and an annotation's span covers
    them: two steps of one copy (0.4 ms of kernels) and one optimizer step (1.2 ms) take
    1.6 ms of device time a step, not the 4.4 ms that adding every event gives."""
    cpu, cuda = DeviceType.CPU, DeviceType.CUDA
    events = [
        _event("aten::copy_", cpu, 2, cpu_us=50, device_us=800),
        _event("void direct_copy_kernel", cuda, 2, device_us=800),
        _event("aten::_fused_adamw_", cpu, 2, cpu_us=30, device_us=2400),
        _event("multi_tensor_apply_kernel", cuda, 2, device_us=2400),
        _event("Optimizer.step#AdamW.step", cuda, 2, device_us=2400, annotation=True),
    ]
    summary = paper_epoch.profile_summary(events, steps=2, on_device=True)
    assert summary["device_ms_per_step"] == 1.6
    assert summary["device_kernels_per_step"] == 2
    assert summary["aten_ops_per_step"] == 2
    assert [e["name"] for e in summary["top_device"]] == [
        "multi_tensor_apply_kernel",
        "void direct_copy_kernel",
    ]
    assert [e["name"] for e in summary["top_device_ops"]] == ["aten::_fused_adamw_", "aten::copy_"]
    assert summary["host_ms_per_step"] == 0.04
    off = paper_epoch.profile_summary(events[:1], steps=1, on_device=False)
    assert off["device_ms_per_step"] is None and off["top_device"] == []
