"""A device of its own on a CPU-only machine, for tests: inside :class:`PretendDevice`,
``cpu:1`` (``PRETEND``) behaves as a second device. Tensors become "on the device" when
made or moved there (``.to(PRETEND)``, ``device=PRETEND``) and report ``PRETEND`` as
their device; tensors made on the host (``torch.tensor``, ``from_numpy``, a factory with
no device, ``.cpu()``, a module's parameters until it is moved) stay there; an operator's
result lives where its operands do. An operator that mixes the two raises
:class:`DeviceMismatch`, as CUDA would, with the same exceptions CUDA makes: 0-dim host
tensors, host index tensors, and copies between the two. Tensors the guard never saw made
(autograd's gradients, tensors from before it) go with either side."""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakTensorKeyDictionary

PRETEND = torch.device("cpu", 1)
HOST, DEVICE = "host", "device"

# CUDA takes host index tensors and copies across devices.
_INDEXING = {"__getitem__", "__setitem__", "index_put_", "index_put"}
_COPIES = {"copy_", "to", "cpu", "cuda", "__set__"}


class DeviceMismatch(RuntimeError):
    pass


def _device_of(func, args, kwargs) -> torch.device | None:
    """Where ``func`` puts its result, if it says: a ``device`` argument, or ``.to``'s."""
    name = getattr(func, "__name__", "")
    if name == "cpu":
        return torch.device("cpu")
    device = kwargs.get("device")
    if device is None and name == "to":
        device = next((a for a in args[1:] if isinstance(a, (torch.device, str))), None)
        if isinstance(device, str) and not device.startswith(("cpu", "cuda")):
            device = None
    return None if device is None else torch.device(device)


class PretendDevice(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.place = WeakTensorKeyDictionary()
        self.checked = 0  # operators seen with an operand on the device

    def where(self, t: torch.Tensor) -> str | None:
        return self.place.get(t)

    def __enter__(self):
        # A module's parameters and buffers are made on the host (a parameter's wrapping of
        # its tensor is not an operator the guard sees).
        def registered(module, name, tensor):
            if tensor is not None and tensor not in self.place:
                self.place[tensor] = HOST

        self.hooks = [
            torch.nn.modules.module.register_module_parameter_registration_hook(registered),
            torch.nn.modules.module.register_module_buffer_registration_hook(registered),
        ]
        return super().__enter__()

    def __exit__(self, *exc):
        for hook in self.hooks:
            hook.remove()
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "__get__" and getattr(func.__self__, "__name__", "") == "device":
            out = func(*args, **kwargs)
            return PRETEND if self.where(args[0]) == DEVICE else out
        target = _device_of(func, args, kwargs)
        if target is not None and target == PRETEND:  # really the CPU
            kwargs = {**kwargs, "device": torch.device("cpu")} if "device" in kwargs else kwargs
            if name == "to":
                args = tuple(torch.device("cpu") if a is target or a == PRETEND else a for a in args)
        if name == "__get__" and getattr(func.__self__, "__name__", "") == "data":
            out = func(*args, **kwargs)
            if self.where(args[0]) is not None:
                self.place[out] = self.where(args[0])
            return out
        if name == "__set__" and getattr(func.__self__, "__name__", "") == "data":
            self.place[args[0]] = self.where(args[1]) or self.where(args[0])
            return func(*args, **kwargs)
        if name in ("numpy", "__array__") and self.where(args[0]) == DEVICE:
            raise DeviceMismatch(f"{name}() of a tensor on the device: copy it to the host first")
        operands = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if name in _INDEXING:  # host index tensors are fine
            operands = operands[:1] + [t for t in operands[1:] if t.is_floating_point()]
        places = {self.where(t) for t in operands if t.dim() > 0} - {None}
        if DEVICE in places:
            self.checked += 1
        out = func(*args, **kwargs)
        results = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if places == {HOST, DEVICE} and name not in _COPIES and results:  # it computed
            shapes = ", ".join(f"{self.where(t) or '?'} {tuple(t.shape)}" for t in operands)
            raise DeviceMismatch(f"{name} mixes tensors on the host and on the device: {shapes}")
        if target is not None:
            place = DEVICE if target == PRETEND else HOST
            if out is args[0] and self.where(out) != place:
                out = out.view_as(out)  # a move is a new tensor (really the same memory)
        elif operands and name.endswith("_") and isinstance(out, torch.Tensor) and out is operands[0]:
            return out  # in place: a tensor stays where it is
        elif DEVICE in places:
            place = DEVICE
        elif HOST in places or not operands:
            place = HOST  # made on the host
        else:
            return out
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.place[t] = place
        return out
