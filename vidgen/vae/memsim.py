"""Peak-memory simulation: run code on fake or meta tensors and count the bytes of live storages.

On meta tensors (the decode planner, on a `meta_copy` of the VAE) or under `FakeTensorMode` (bench/,
whole diffusers models) no data is computed, so a full-size 720p decode "runs" in seconds; a
dispatch mode records every storage an op creates and drops it when Python frees it (storages
keep their Python object, so a weak reference fires exactly when the memory would be released).
Sizes are rounded like the allocators do (CUDA's caching allocator: 512-byte blocks; CPU: pages).
The decode planner uses this to check a plan against the budget; bench/ uses it for full-size
figures and validates it against measured peaks.
"""

from __future__ import annotations

import contextlib
import weakref

import torch
from torch._guards import active_fake_mode
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..memo import Frozen, Memo
from ..ops import OPS, VaeOps, workspace_bytes
from .decoder import onednn_slices

ROUNDING = {"cuda": 512, "mps": 16384, "cpu": 4096}


class LiveBytes(TorchDispatchMode):
    """Counts bytes held by storages created while active; `peak` is the high-water mark."""

    def __init__(self, device_type: str = "cpu"):
        super().__init__()
        self.device_type = device_type
        self.round = ROUNDING.get(device_type, 512)
        self.current = 0
        self.peak = 0
        self._live: dict[int, int] = {}
        self._refs: list = []

    def _free(self, key: int) -> None:
        self.current -= self._live.pop(key, 0)

    def _rounded(self, nbytes: int) -> int:
        """`nbytes` as the allocator hands it out (whole blocks or pages)."""
        return -(-nbytes // self.round) * self.round

    def track(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        key = id(st)
        if key in self._live:
            return
        size = self._rounded(st.nbytes())
        self._live[key] = size
        self.current += size
        self.peak = max(self.peak, self.current)
        self._refs.append(weakref.ref(st, lambda _, k=key: self._free(k)))

    def transient(self, nbytes: int) -> None:
        """Count `nbytes` allocated and freed within one op (a workspace) on top of what is live."""
        self.peak = max(self.peak, self.current + self._rounded(nbytes))

    def workspace(self, op: str, args: tuple) -> None:
        """Count the transient bytes the torch backend of vidgen op `op` allocates with `args`."""
        self.transient(workspace_bytes(op, args))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "vidgen":      # our custom ops: count their torch twins' workspace
            self.workspace(func.name(), args)
        elif func is torch.ops.aten.convolution.default and self.device_type == "cpu":
            self.transient(onednn_workspace(args[0], args[1]))
        out = func(*args, **(kwargs or {}))
        if func._overloadpacket in _VIEW_OPS:
            return out
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.track(t)
        return out


def onednn_workspace(x: torch.Tensor, weight: torch.Tensor) -> int:
    """Transient bytes of a float32 CPU convolution through oneDNN (decoder.conv3d): one slice of its
    weights and its input reordered into oneDNN's blocked layout for the call (measured: a
    384-channel 3x3x3 conv on a 64x64 frame grows resident memory by weights plus input), and with
    several slices their outputs, which torch.cat joins into the result."""
    if x.dtype != torch.float32:
        return 0
    n = onednn_slices(weight) if weight.dim() == 5 else 1     # conv2d: F.conv2d, one call
    out = 0
    if n > 1:
        out = x.shape[0] * weight.shape[0] * (x.shape[2] - weight.shape[2] + 1) * x.shape[3] * x.shape[4]
    return (weight.numel() // n + x.numel() + out) * 4


_VIEW_OPS = {torch.ops.aten.view, torch.ops.aten._unsafe_view, torch.ops.aten.slice, torch.ops.aten.select,
             torch.ops.aten.permute, torch.ops.aten.expand, torch.ops.aten.as_strided, torch.ops.aten.transpose,
             torch.ops.aten.unsqueeze, torch.ops.aten.squeeze, torch.ops.aten.t, torch.ops.aten.alias,
             torch.ops.aten.detach, torch.ops.aten.split, torch.ops.aten.chunk, torch.ops.aten.unbind}


@contextlib.contextmanager
def fake_mode():
    """A FakeTensorMode that also accepts the real modules' parameters (converted, never computed).

    Inside an active fake mode (e.g. a planner called on a fake model), that mode is reused.
    """
    active = active_fake_mode()
    if active is not None:
        yield active
        return
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        yield mode


def meta_copy(module: torch.nn.Module, memo: Memo | None = None) -> torch.nn.Module:
    """A copy of a diffusers model on the meta device (shapes only, no memory), built from its
    config and kept in `memo`'s "meta copies" part for reuse; the user's module is never touched.
    Meta tensors run each op's shape function in C++, several times quicker than fake tensors, whose
    mode also converts every real parameter again on each op."""
    param = next(module.parameters())

    def build():
        with unset_fake_temporarily(), torch.device("meta"), default_dtype(param.dtype):
            return type(module).from_config(module.config).eval().requires_grad_(False)

    if memo is None:
        return build()
    return memo.part("meta copies", 8).cached((type(module), config_key(module), param.dtype), build)


def config_key(module: torch.nn.Module) -> Frozen:
    """A diffusers model's config, frozen: what its simulations and plans are keyed by."""
    return Frozen(module.config)


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """Build modules directly in `dtype` (fake parameters cannot be cast after construction)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def counting_ops(trackers: list[LiveBytes]):
    """A VaeOps table for simulations: each op only adds its torch backend's workspace to the
    innermost of `trackers` (the ops write into buffers the caller made, so on meta tensors they
    have nothing else to do); several times cheaper than dispatching the registered custom ops."""
    def op(name):
        def count(*args, **kwargs):
            trackers[-1].workspace(name, args)
        return count

    return VaeOps("counting", **{name: op(name) for name in OPS})
