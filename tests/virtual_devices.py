"""Virtual accelerator devices on a CPU-only torch, to run GPU code paths here.

Tensors keep their data on the CPU but report a device ``meta:N`` (``OnDevice``). Inside ``VirtualDevices`` every
operation is checked as CUDA checks it: the tensors an operation reads must share one device, but a 0-dim CPU
tensor (a scalar) may meet any device, indices of advanced indexing may stay on the CPU, and copies move
between devices. A mix raises CUDA's error. Factories create on the device they are asked for. Host syncs,
the points where CUDA would wait for the device (``item()``, ``tolist()``, a copy to the CPU, an operation whose
output size depends on the data), are counted, and so are copies from pageable (not pinned) CPU memory to a
device (``torch.tensor(..., device=)`` included): CUDA makes the host wait for the device's stream before them.

``place(model, devices)`` puts a model on one virtual device, or spreads its layers over two as accelerate's
``device_map="auto"`` does: the embeddings and the first half of the layers on the first, the rest, the final norm
and the head on the second, each module's inputs moved to its device by a hook.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

aten = torch.ops.aten
COPIES = {aten._to_copy.default, aten.copy_.default, aten.lift_fresh.default}
INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}
SYNCING = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default, aten.equal.default}
SYNCING |= {aten.is_nonzero.default, aten.unique_consecutive.default, aten._unique2.default}


class OnDevice(torch.Tensor):
    """A CPU tensor that reports a virtual device."""

    @staticmethod
    def __new__(cls, elem: torch.Tensor, device: torch.device):
        tensor = torch.Tensor._make_wrapper_subclass(
            cls,
            elem.shape,
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            layout=elem.layout,
            device=device,
            requires_grad=elem.requires_grad,
        )
        tensor.elem = elem
        return tensor

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return run(func, args, kwargs or {}, Counter())

    def __repr__(self) -> str:
        return f"OnDevice({self.elem!r}, device={self.device})"


def virtual(device: torch.device | str | None) -> bool:
    return device is not None and torch.device(device).type == "meta"


def pageable(tensor: torch.Tensor) -> bool:
    """A CPU tensor outside pinned memory: CUDA copies it to a device only once the device's stream is idle."""
    return tensor.device.type == "cpu" and not (torch.cuda.is_available() and tensor.is_pinned())


def run(func, args: tuple, kwargs: dict, syncs: Counter):
    """One operation on the CPU data of its operands, checked as CUDA checks it; host syncs go to ``syncs``."""
    tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    operands = [t for t in tensors if not (t.device.type == "cpu" and t.dim() == 0)]
    if func in INDEXING:  # CUDA moves CPU indices to the indexed tensor's device
        operands = [args[0], *(t for t in operands[1:] if t.device.type != "cpu")]
    devices = {t.device for t in operands}
    if len(devices) > 1 and func not in COPIES:
        first, second = sorted(map(str, devices))[:2]
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, {first} and "
            f"{second}! (in {func})"
        )
    target = next(iter(devices)) if devices else torch.device(kwargs.get("device") or "cpu")
    if func is aten._to_copy.default and "device" in kwargs:
        target = torch.device(kwargs["device"])
    if func is aten.copy_.default:
        target = args[0].device
    if func in SYNCING and any(virtual(t.device) for t in tensors):
        syncs[str(func)] += 1
    if func in COPIES and target.type == "cpu" and any(virtual(t.device) for t in tensors):
        syncs["copy to the CPU"] += 1
    if func in COPIES and virtual(target) and any(pageable(t) for t in tensors):
        syncs["copy from pageable CPU memory"] += 1

    def unwrap(value):
        if isinstance(value, OnDevice):
            return value.elem
        if isinstance(value, torch.device) and value.type == "meta":
            return torch.device("cpu")
        return value

    out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
    if func._schema.name.endswith("_") or func is aten.copy_.default:
        return args[0]  # an in-place operation returns its own (wrapped) self

    def wrap(value):
        if isinstance(value, torch.Tensor) and virtual(target):
            return OnDevice(value, target)
        return value

    return tree_map(wrap, out)


class VirtualDevices(TorchDispatchMode):
    """Runs every operation on the CPU data, checks devices as CUDA does, counts host syncs."""

    def __init__(self) -> None:
        super().__init__()
        self.syncs: Counter = Counter()

    @property
    def sync_count(self) -> int:
        return sum(self.syncs.values())

    def reset(self) -> None:
        self.syncs.clear()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return run(func, args, kwargs or {}, self.syncs)


def _move(value, device: torch.device):
    return tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, value)


def _on(module: nn.Module, device: torch.device) -> None:
    """Put a module's own parameters and buffers (not its children's) on ``device``."""
    for name, parameter in list(module.named_parameters(recurse=False)):
        setattr(module, name, nn.Parameter(OnDevice(parameter.data, device), requires_grad=False))
    for name, buffer in list(module.named_buffers(recurse=False)):
        module._buffers[name] = OnDevice(buffer, device)


def _align(module: nn.Module, device: torch.device, io_same_device: bool = False) -> None:
    """As accelerate's hooks: the module's inputs move to its device before it runs (its ``forward`` is wrapped, so
    suspending the module's hooks does not stop it); ``io_same_device``: the outputs move back to the device of
    its first input tensor (the dispatched model as a whole)."""
    forward = module.forward

    def aligned(*args, **kwargs):
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        output = forward(*_move(args, device), **_move(kwargs, device))
        return _move(output, inputs[0].device) if io_same_device and inputs else output

    module.forward = aligned


def place(model: nn.Module, devices: int = 1) -> nn.Module:
    """``model`` on virtual device meta:0, or spread over meta:0 and meta:1 as ``device_map="auto"`` would."""
    first, second = torch.device("meta", 0), torch.device("meta", 1)
    stack = model.model
    split = len(stack.layers) // 2 if devices == 2 else len(stack.layers)
    later = [*stack.layers[split:], stack.norm, model.lm_head] if devices == 2 else []
    on_second = {id(module) for top in later for module in top.modules()}
    for module in model.modules():
        _on(module, second if id(module) in on_second else first)
    if devices == 2:
        _align(model, first, io_same_device=True)
        for index, layer in enumerate(stack.layers):
            _align(layer, second if index >= split else first)
        for module in (stack.norm, model.lm_head):
            _align(module, second)
        model.hf_device_map = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.norm": 1, "lm_head": 1}
        model.hf_device_map |= {f"model.layers.{i}": int(i >= split) for i in range(len(stack.layers))}
    return model


class HostSide(TorchFunctionMode):
    """What never reaches the dispatcher: ``torch.tensor`` and ``torch.as_tensor`` build on the CPU then move, so a
    device index is kept; ``tolist()`` and ``numpy()`` of a virtual tensor read its data, counted as a host sync."""

    def __init__(self, syncs: Counter) -> None:
        super().__init__()
        self.syncs = syncs

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.tensor, torch.as_tensor) and virtual(kwargs.get("device")):
            device = kwargs.pop("device")
            return func(*args, **kwargs).to(device)
        if func in (torch.Tensor.tolist, torch.Tensor.numpy) and isinstance(args[0], OnDevice):
            self.syncs[func.__name__] += 1
            return func(args[0].elem, *args[1:], **kwargs)
        return func(*args, **kwargs)


@contextmanager
def virtual_devices() -> Iterator[VirtualDevices]:
    """Inside the block, virtual devices behave as CUDA devices; autocast knows them as CUDA would know its own."""
    is_autocast_enabled = torch.is_autocast_enabled

    def autocast_enabled(device_type: str | None = None) -> bool:
        if device_type == "meta":
            return False
        return is_autocast_enabled() if device_type is None else is_autocast_enabled(device_type)

    torch.is_autocast_enabled = autocast_enabled
    try:
        dispatch = VirtualDevices()
        with HostSide(dispatch.syncs), dispatch:
            yield dispatch
    finally:
        torch.is_autocast_enabled = is_autocast_enabled
