"""Fused VAE ops vs the unfused PyTorch sequences they replace in diffusers' Wan decoder.

For every op of `vidgen.ops.op_table` at decoder sites: the bytes each side must move, the median
time, the achieved GB/s (also as a % of a plain device copy, measured in the same run), the ratio
unfused/fused, and a sanity check that both sides produce the same tensors. `--check` also runs each
fused backend against the reference twin on fresh inputs (both layouts, first/later chunks, poisoned
outputs): bit-exact for every op.

    python bench/fused_ops.py                                             # CPU, small shapes, fp32
    python bench/fused_ops.py --device cuda --shape wan22-720p --dtype bfloat16 --check --json k.json
    TRITON_INTERPRET=1 python bench/fused_ops.py --shape tiny --kernels triton --check   # Triton on CPU, slowly

Bytes: the fused side's are the fewest its op can move (inputs read once, outputs written once);
the unfused side's are the same count for every kernel of its sequence (a dispatch mode sums each
aten op's inputs and outputs; views move nothing). The unfused sequences are diffusers' own modules
where one step is a module (WanRMS_norm, WanUpsample, DupUp3D) and otherwise the lines of
WanResidualBlock / WanCausalConv3d.forward (cache clone, cat, pad); convolutions are left out of
both sides. The fused conv input allocates its [N, C, 2+T, H, W] buffer per call, as the decoder does.
The unfused upsample starts from diffusers' frame batch [T, C, H, W] (WanResample's permute copy is
not counted); cache shifts and DupUp3D run as on a later chunk (first=False). Sites: `--shape`
(tiny, small: Wan2.1-like widths for the CPU; wan22-720p: Wan2.2's decoder at 1280x704).
Figures go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
LAYOUTS = {"ncdhw": torch.contiguous_format, "ndhwc": torch.channels_last_3d}
TARGET_OF_COPY = 0.70          # fused GPU kernels should reach this fraction of a plain copy's GB/s


# --------------------------------------------------------------------------------------------
# Sites


@dataclass(frozen=True)
class Case:
    """One op at one decoder site. x = (C, T, H, W) of the op's main input; `extra` is op-specific:
    window_gather (h, w, y0, x0); dup_up_add (C_out, factor_t, factor_s)."""

    op: str
    site: str
    x: tuple[int, int, int, int]
    extra: tuple[int, ...] = ()


NORM_OPS = ("conv_input", "rms_norm_silu", "causal_cache_shift")


def _norm_sites(*sites: tuple[str, tuple[int, int, int, int]]) -> list[Case]:
    return [Case(op, name, x) for op in NORM_OPS for name, x in sites]


# Wan2.2 decoder at 1280x704 (latent 44x80; the decoder works at 352x640 before unpatchify), one latent
# frame per chunk: up0 runs 1 frame, up1 2, up2/up3/head 4 (frames_per_step). Sites by bytes per step:
# up3's six 256-channel norms (res1/res2 and norm_out) dominate, then up3.res0 (512 in), up2.
PRESETS: dict[str, list[Case]] = {
    "tiny": [   # for --check under TRITON_INTERPRET=1 and smoke runs
        *_norm_sites(("c16", (16, 4, 10, 12)), ("c8-t1", (8, 1, 9, 7))),
        Case("window_gather", "interior", (16, 4, 12, 14), (8, 9, 2, 3)),
        Case("window_gather", "edge", (8, 2, 10, 12), (8, 9, -3, 5)),
        Case("upsample_nearest2x", "c16", (16, 4, 6, 7)),
        Case("dup_up_add", "ft2", (16, 2, 5, 6), (16, 2, 2)),
        Case("dup_up_add", "ft1", (16, 4, 5, 6), (8, 1, 2)),
    ],
    "small": [  # Wan2.1-like widths at small frames; CPU default (about a minute on 2 cores)
        *_norm_sites(("c384 64x64", (384, 4, 64, 64)), ("c96 90x160", (96, 4, 90, 160))),
        Case("window_gather", "tile crop c384", (384, 4, 64, 64), (40, 40, 12, 12)),
        Case("window_gather", "frame edge c96", (96, 4, 90, 160), (60, 90, -7, -7)),
        Case("upsample_nearest2x", "c384 32x32", (384, 4, 32, 32)),
        Case("upsample_nearest2x", "c192 45x80", (192, 4, 45, 80)),
        Case("dup_up_add", "c384 ft2", (384, 2, 32, 32), (384, 2, 2)),
        Case("dup_up_add", "c384->192 ft1", (384, 4, 45, 80), (192, 1, 2)),
    ],
    "wan22-720p": [
        *_norm_sites(("up2.res0.norm1", (1024, 4, 176, 320)), ("up2.res1.norm1", (512, 4, 176, 320)),
                     ("up3.res0.norm1", (512, 4, 352, 640)), ("up3.res1.norm1", (256, 4, 352, 640))),
        # tile crops of a 2x4-tile plan (halos 12/10/7 px after up0/up1/up2), and a frame-edge window
        Case("window_gather", "crop after up1", (1024, 4, 136, 128), (108, 100, 14, 14)),
        Case("window_gather", "crop after up2", (512, 4, 216, 200), (190, 174, 13, 13)),
        Case("window_gather", "frame edge up2", (512, 4, 352, 640), (190, 174, -7, -7)),
        Case("upsample_nearest2x", "up1.upsampler", (1024, 4, 88, 160)),
        Case("upsample_nearest2x", "up2.upsampler", (512, 4, 176, 320)),
        Case("dup_up_add", "up1.avg_shortcut", (1024, 2, 88, 160), (1024, 2, 2)),
        Case("dup_up_add", "up2.avg_shortcut", (1024, 4, 176, 320), (512, 1, 2)),
    ],
}
DEFAULT_DTYPES = {"tiny": "float32", "small": "float32", "wan22-720p": "bfloat16,float32"}


# --------------------------------------------------------------------------------------------
# Bytes and time


def distinct_bytes(t: torch.Tensor) -> int:
    """Bytes of the elements `t` addresses (a broadcast dimension counts once)."""
    return math.prod(s for s, st in zip(t.shape, t.stride()) if st != 0) * t.element_size()


class BytesMoved(TorchDispatchMode):
    """Sums, over every aten kernel run, the bytes it reads and writes; views move nothing."""

    WRITE_ONLY = {torch.ops.aten.copy_, torch.ops.aten.fill_, torch.ops.aten.zero_}

    def __init__(self):
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if not func._schema.is_mutable:
            ptrs = {t.untyped_storage().data_ptr() for t in ins}
            if any(o.untyped_storage().data_ptr() in ptrs for o in outs):
                return out                                    # a view (or an alias) of an input
        write_only = {id(kwargs["out"])} if "out" in kwargs else set()
        if func.overloadpacket in self.WRITE_ONLY:
            write_only.add(id(args[0]))
        self.total += sum(distinct_bytes(t) for t in ins if id(t) not in write_only)
        self.total += sum(distinct_bytes(t) for t in outs)
        return out


def count_bytes(fn: Callable[[], object]) -> int:
    counter = BytesMoved()
    with counter, torch.no_grad():
        fn()
    return counter.total


def median_seconds(fn: Callable[[], object], device: torch.device, warmup: int, reps: int) -> float:
    """Median wall time of `fn` after `warmup` calls (CUDA events around each call on the GPU)."""
    with torch.no_grad():
        for _ in range(warmup):
            fn()
        times = []
        if device.type == "cuda":
            torch.cuda.synchronize()
            for _ in range(reps):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
        else:
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_bandwidth(device: torch.device, mib: int, warmup: int, reps: int) -> dict:
    """A plain device copy (dst.copy_(src)), counting bytes read + written: the ceiling for the ops."""
    n = mib * 2**20 // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    s = median_seconds(lambda: dst.copy_(src), device, warmup, reps)
    return {"op": "copy", "bytes": 2 * src.nbytes, "time_ms": s * 1e3, "gbps": 2 * src.nbytes / s / 1e9}


# --------------------------------------------------------------------------------------------
# The two sides of each op


@dataclass
class Prepared:
    """One case's inputs, bound: both sides return views of the tensors to compare."""

    unfused: Callable[[], tuple]
    fused: Callable[[object], tuple]        # takes a VaeOps
    reset: Callable[[], None]               # restores what the fused side mutates
    fused_bytes: int
    exact: bool                             # data movement: bit-exact expected


def _rand(shape, dtype, device, layout, gen) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=device, memory_format=LAYOUTS[layout]).normal_(generator=gen)


def _diffusers_cache(prev: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """WanResidualBlock's next cache: the chunk's last 2 frames (with the old cache's last for T = 1)."""
    cache_x = y[:, :, -2:].clone()
    if cache_x.shape[2] < 2:
        cache_x = torch.cat([prev[:, :, -1].unsqueeze(2), cache_x], dim=2)
    return cache_x


def prepare(case: Case, dtype, device, layout: str, seed: int = 0) -> Prepared:
    from diffusers.models.autoencoders.autoencoder_kl_wan import DupUp3D, WanRMS_norm, WanUpsample

    gen = torch.Generator(device).manual_seed(seed)
    c, t, h, w = case.x
    es = torch.empty((), dtype=dtype).element_size()
    fmt = LAYOUTS[layout]
    frame = c * h * w * es                                           # one frame of x, bytes
    nop = lambda: None  # noqa: E731

    if case.op in NORM_OPS:
        x = _rand((1, c, t, h, w), dtype, device, layout, gen)
        gamma = torch.empty(c, dtype=dtype, device=device).uniform_(0.5, 1.5, generator=gen)
        norm = WanRMS_norm(c, images=False).to(device, dtype).requires_grad_(False)
        norm.gamma.copy_(gamma.view(-1, 1, 1, 1))
        cache0 = _rand((1, c, 2, h, w), dtype, device, layout, gen)
        cache = cache0.clone()
        reset = lambda: cache.copy_(cache0)  # noqa: E731

    if case.op == "rms_norm_silu":
        out = torch.empty_like(x)

        def fused(ops):
            ops.rms_norm_silu_into(x, gamma, out)
            return (out,)
        return Prepared(lambda: (F.silu(norm(x)),), fused, nop, 2 * t * frame + c * es, False)

    if case.op == "conv_input":
        def unfused():       # WanResidualBlock: norm1, SiLU, cache clone; then conv1's cat + causal pad
            y = F.silu(norm(x))
            new_cache = _diffusers_cache(cache0, y)
            padded = F.pad(torch.cat([cache0, y], dim=2), (1, 1, 1, 1, 2 - cache0.shape[2], 0))
            return padded[..., 1:-1, 1:-1], new_cache

        def fused(ops):      # the decoder's causal_conv: one buffer, conv3d pads H/W itself
            buf = torch.empty((1, c, 2 + t, h, w), dtype=dtype, device=device, memory_format=fmt)
            ops.rms_norm_silu_into(x, gamma, buf[:, :, 2:])
            ops.causal_cache_shift(buf, cache, False)
            return buf, cache
        return Prepared(unfused, fused, reset, 2 * t * frame + c * es + 8 * frame, False)

    if case.op == "causal_cache_shift":
        buf = torch.empty((1, c, 2 + t, h, w), dtype=dtype, device=device, memory_format=fmt)
        buf[:, :, 2:] = x

        def unfused():       # diffusers: keep the last 2 frames, prepend the cache
            return torch.cat([cache0, x], dim=2), _diffusers_cache(cache0, x)

        def fused(ops):      # reads/writes 2 frames each of cache, head, tail; x is already in buf
            ops.causal_cache_shift(buf, cache, False)
            return buf, cache
        return Prepared(unfused, fused, reset, 8 * frame, True)

    if case.op == "window_gather":
        oh, ow, y0, x0 = case.extra
        src = _rand((1, c, t, h, w), dtype, device, layout, gen)
        out = torch.empty((1, c, t, oh, ow), dtype=dtype, device=device, memory_format=fmt)
        ya, yb, xa, xb = max(y0, 0), min(y0 + oh, h), max(x0, 0), min(x0 + ow, w)

        def unfused():       # slice + copy, zero fill by F.pad where the window leaves the frame
            crop = src[..., ya:yb, xa:xb]
            if (ya, yb, xa, xb) == (y0, y0 + oh, x0, x0 + ow):
                return (crop.contiguous(memory_format=fmt),)
            return (F.pad(crop, (xa - x0, x0 + ow - xb, ya - y0, y0 + oh - yb)),)
        def fused(ops):
            ops.window_gather(src, out, y0, x0)
            return (out,)
        inside = c * t * max(0, yb - ya) * max(0, xb - xa) * es
        return Prepared(unfused, fused, nop, inside + out.numel() * es, True)

    if case.op == "upsample_nearest2x":
        x = _rand((1, c, t, h, w), dtype, device, layout, gen)
        frames = x.permute(0, 2, 1, 3, 4).reshape(t, c, h, w)             # diffusers' [B*T, C, H, W]
        frames = frames.contiguous(memory_format=torch.channels_last if layout == "ndhwc" else torch.contiguous_format)
        up = WanUpsample(scale_factor=(2.0, 2.0), mode="nearest-exact")      # x.float(), interpolate, back
        out = torch.empty((1, c, t, 2 * h, 2 * w), dtype=dtype, device=device, memory_format=fmt)

        def fused(ops):
            ops.upsample_nearest2x_into(x, out)
            return (out,)
        return Prepared(lambda: (up(frames).unsqueeze(0).transpose(1, 2),), fused, nop, 5 * t * frame, True)

    if case.op == "dup_up_add":
        co, ft, fs = case.extra
        x = _rand((1, c, t, h, w), dtype, device, layout, gen)
        y_init = _rand((1, co, t * ft, h * fs, w * fs), dtype, device, layout, gen)
        y = y_init.clone()
        dup = DupUp3D(c, co, ft, fs)

        def fused(ops):      # in place; timed repeats keep adding to y, which changes no timing
            ops.dup_up_add(y, x, ft, fs, False)
            return (y,)
        return Prepared(lambda: (y_init + dup(x, first_chunk=False),),     # WanResidualUpBlock: x + shortcut
                        fused, lambda: y.copy_(y_init), x.numel() * es + 2 * y.numel() * es, True)
    raise ValueError(f"unknown op {case.op!r}")


def tolerance(dtype) -> dict:
    """Fused norm (one rounding) vs diffusers' (a rounding after each of five ops): a few output ulps."""
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 4e-2, "atol": 2e-2}


def compare(a: tuple, b: tuple, exact: bool, tol: dict) -> tuple[bool, float, int, int]:
    """(ok, max abs diff, elements bit-equal, elements compared) of tensor pairs [N, C, T, H, W].

    Frame by frame, so the float temporaries stay small at 720p. NaN (an unwritten poisoned output)
    must sit at the same places in both; elsewhere: equal (exact) or allclose (`tol`).
    """
    ok, worst, equal, total = True, 0.0, 0, 0
    for u, v in zip(a, b):
        if u.shape != v.shape:
            return False, float("inf"), 0, 0
        for i in range(u.shape[2]):
            uf, vf = u[:, :, i].float(), v[:, :, i].float()
            nan_u, nan_v = uf.isnan(), vf.isnan()
            ok &= bool(torch.equal(nan_u, nan_v))
            uf, vf = uf[~nan_v], vf[~nan_v]
            if uf.numel():
                worst = max(worst, float((uf - vf).abs().nan_to_num(float("inf")).max()))
            equal += int((uf == vf).sum())
            total += uf.numel()
            ok &= bool(torch.equal(uf, vf)) if exact else bool(torch.allclose(uf, vf, **tol))
    return ok, worst, equal, total


# --------------------------------------------------------------------------------------------
# Fused backend vs the reference twin (--check)


def check_inputs(case: Case, dtype, device, layout: str, variant: str, seed: int):
    """(op name, args, tensors to compare) for one check; outputs start as NaN so unwritten elements show."""
    gen = torch.Generator(device).manual_seed(seed)
    c, t, h, w = case.x
    fmt = LAYOUTS[layout]
    if case.op in ("conv_input", "rms_norm_silu"):
        x = _rand((1, c, t, h, w), dtype, device, layout, gen) * 3
        x[..., 0, 0] = 0                                    # all-zero locations hit the eps clamp
        gamma = torch.empty(c, dtype=dtype, device=device).uniform_(0.5, 1.5, generator=gen)
        buf = torch.full((1, c, 2 + t, h, w), float("nan"), dtype=dtype, device=device).contiguous(memory_format=fmt)
        return "rms_norm_silu_into", (x, gamma, buf[:, :, 2:]), (buf,), {"silu": variant != "no silu"}
    if case.op == "causal_cache_shift":
        tt = 1 if variant == "T=1" else t
        buf = _rand((1, c, 2 + tt, h, w), dtype, device, layout, gen)
        buf[:, :, :2] = float("nan")
        cache = _rand((1, c, 2, h, w), dtype, device, layout, gen)
        return "causal_cache_shift", (buf, cache, variant == "first"), (buf, cache), {}
    if case.op == "window_gather":
        oh, ow, y0, x0 = case.extra
        if variant == "larger than src":
            oh, ow, y0, x0 = h + 5, w + 3, -2, -1
        src = _rand((1, c, t, h, w), dtype, device, layout, gen)
        out = torch.full((1, c, t, oh, ow), float("nan"), dtype=dtype, device=device).contiguous(memory_format=fmt)
        return "window_gather", (src, out, y0, x0), (out,), {}
    if case.op == "upsample_nearest2x":
        if variant == "strided x":     # a permuted view, like the interleaved time_conv output
            x = _rand((1, t, c, h, w), dtype, device, "ncdhw", gen).permute(0, 2, 1, 3, 4)
        else:
            x = _rand((1, c, t, h, w), dtype, device, layout, gen)
        out = torch.full((1, c, t, 2 * h, 2 * w), float("nan"), dtype=dtype, device=device).contiguous(memory_format=fmt)
        return "upsample_nearest2x_into", (x, out), (out,), {}
    if case.op == "dup_up_add":
        co, ft, fs = case.extra
        first = variant == "first"
        x = _rand((1, c, t, h, w), dtype, device, layout, gen)
        y = _rand((1, co, t * ft - (ft - 1 if first else 0), h * fs, w * fs), dtype, device, layout, gen)
        return "dup_up_add", (y, x, ft, fs, first), (y,), {}
    raise ValueError(case.op)


CHECK_VARIANTS = {"conv_input": (), "rms_norm_silu": ("silu", "no silu"), "causal_cache_shift": ("later", "first", "T=1"),
                  "window_gather": ("as site", "larger than src"), "upsample_nearest2x": ("dense x", "strided x"),
                  "dup_up_add": ("later", "first")}


def check_backend(ops, twin, case: Case, dtype, device, layouts) -> list[dict]:
    rows = []
    for layout in layouts:
        for k, variant in enumerate(CHECK_VARIANTS[case.op]):
            seed = 1000 + k
            name, args, outs, kw = check_inputs(case, dtype, device, layout, variant, seed)
            _, args_ref, outs_ref, _ = check_inputs(case, dtype, device, layout, variant, seed)
            getattr(ops, name)(*args, **kw)
            getattr(twin, name)(*args_ref, **kw)
            # every op follows its twin step by step (the norm's exp included): bit-equal expected
            ok, worst, equal, total = compare(outs, outs_ref, True, {})
            rows.append({"backend": ops.backend, "op": name, "site": case.site, "dtype": str(dtype).split(".")[-1],
                         "layout": layout, "variant": variant, "ok": ok, "max_abs_diff": worst,
                         "bit_equal": round(equal / max(total, 1), 6)})
            del args, args_ref, outs, outs_ref
    return rows


# --------------------------------------------------------------------------------------------
# Driver


def backends_for(spec: str, device: torch.device) -> tuple[list, list[str]]:
    """The VaeOps tables to time (the reference twin, the kernels' bit-exact oracle, always, last) and
    the ones that could not load."""
    from vidgen.ops import resolve_backend, op_table

    names, missing = [], []
    for name in spec.split(","):
        try:
            names.append(resolve_backend(name.strip(), device))
        except Exception as e:          # ConfigError: not installed / wrong device
            missing.append(f"{name}: {e}")
    tables = []
    for name in dict.fromkeys([n for n in names if n != "reference"] + ["reference"]):
        try:
            tables.append(op_table(name, device))
        except Exception as e:          # the backend's module fails to import
            missing.append(f"{name}: {type(e).__name__}: {e}")
    return tables, missing


def shape_text(case: Case) -> str:
    c, t, h, w = case.x
    text = f"{c}x{t}x{h}x{w}"
    if case.op == "window_gather":
        text += " -> {}x{} @({},{})".format(*case.extra)
    if case.op == "upsample_nearest2x":
        text += f" -> {2 * h}x{2 * w}"
    if case.op == "dup_up_add":
        co, ft, fs = case.extra
        text += f" -> {co}x{t * ft}x{h * fs}x{w * fs}"
    return text


def run(args) -> dict:
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    warmup = args.warmup if args.warmup is not None else (2 if cuda else 1)
    reps = args.reps if args.reps is not None else (10 if cuda else 7)
    tables, missing = backends_for(args.kernels, device)
    twin = next(t for t in tables if t.backend == "reference")
    meta = {"device": torch.cuda.get_device_name(device) if cuda else "cpu", "torch": torch.__version__,
            "threads": torch.get_num_threads(), "shape": args.shape, "layout": args.layout,
            "backends": [t.backend for t in tables], "unavailable": missing, "warmup": warmup, "reps": reps}
    try:
        import triton
        meta["triton"] = triton.__version__
    except Exception:
        pass
    for m in missing:
        print(f"backend unavailable: {m}", flush=True)
    copy = copy_bandwidth(device, args.copy_mib or (2048 if cuda else 256), warmup, max(reps, 5))
    print(f"device copy: {copy['gbps']:.1f} GB/s ({copy['bytes'] / 2**20:.0f} MiB read+written in "
          f"{copy['time_ms']:.2f} ms)", flush=True)
    cases = PRESETS[args.shape]
    if args.ops:
        cases = [c for c in cases if c.op in args.ops.split(",")]
    layouts = list(LAYOUTS) if args.layout == "both" else args.layout.split(",")
    result = {"meta": meta, "copy": copy, "rows": [], "checks": []}

    def record(key: str, item: dict) -> None:     # the JSON is rewritten as rows come: a timeout keeps them
        result[key].append(item)
        print(json.dumps({key: item}), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))

    for dname in args.dtype.split(","):
        dtype = DTYPES[dname]
        if args.check:                                # correctness first, then speed
            for ops in tables:
                if ops.backend in ("torch", "reference"):    # torch matches diffusers, not the twin's bits
                    continue
                for case in cases:
                    if case.op == "conv_input":       # the same op as rms_norm_silu at the same site
                        continue
                    for r in check_backend(ops, twin, case, dtype, device, layouts):
                        record("checks", r)
                    if cuda:
                        torch.cuda.empty_cache()
        for layout in layouts:
            for case in cases:
                p = prepare(case, dtype, device, layout)
                base = {"dtype": dname, "layout": layout, "op": case.op, "site": case.site, "shape": shape_text(case)}
                ref = p.unfused()
                u_bytes = count_bytes(p.unfused)
                u_s = median_seconds(p.unfused, device, warmup, reps)
                record("rows", {**base, "impl": "unfused", "bytes": u_bytes, "time_ms": u_s * 1e3,
                                "gbps": u_bytes / u_s / 1e9})
                for ops in tables:
                    p.reset()
                    ok, worst, _, _ = compare(p.fused(ops), ref, p.exact, tolerance(dtype))
                    s = median_seconds(lambda: p.fused(ops), device, warmup, reps)
                    record("rows", {**base, "impl": ops.backend, "bytes": p.fused_bytes, "time_ms": s * 1e3,
                                    "gbps": p.fused_bytes / s / 1e9, "speedup": u_s / s, "same_as_unfused": ok,
                                    "max_abs_diff": worst})
                del p, ref
                if cuda:
                    torch.cuda.empty_cache()
    return result


def markdown(result: dict) -> str:
    copy = result["copy"]["gbps"]
    lines = [f"device copy (read+write): {copy:.1f} GB/s", "",
             "| dtype | layout | op | site | shape (C x T x H x W) | impl | MB moved | time ms | GB/s | % copy "
             "| unfused/fused | same |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        same = "" if r["impl"] == "unfused" else ("ok" if r["same_as_unfused"] else f"NO ({r['max_abs_diff']:.2e})")
        speed = f"{r['speedup']:.2f}x" if "speedup" in r else ""
        lines.append(f"| {r['dtype']} | {r['layout']} | {r['op']} | {r['site']} | {r['shape']} | {r['impl']} "
                     f"| {r['bytes'] / 1e6:.1f} | {r['time_ms']:.3f} | {r['gbps']:.1f} | {100 * r['gbps'] / copy:.0f}% "
                     f"| {speed} | {same} |")
    if result["checks"]:
        failed = [c for c in result["checks"] if not c["ok"]]
        lines += ["", f"check vs the reference twin: {len(result['checks']) - len(failed)}/{len(result['checks'])} ok"]
        for c in failed:
            lines.append(f"  FAILED {c['backend']} {c['op']} {c['site']} {c['dtype']} {c['layout']} {c['variant']}: "
                         f"max abs diff {c['max_abs_diff']:.3e}, bit-equal {c['bit_equal']:.4f}")
        norm = [c for c in result["checks"] if c["op"] == "rms_norm_silu_into"]
        if norm:
            lines.append(f"  rms_norm_silu_into: max abs diff {max(c['max_abs_diff'] for c in norm):.3e}, "
                         f"bit-equal fraction >= {min(c['bit_equal'] for c in norm):.4f}")
    return "\n".join(lines)


def compact(result: dict) -> str:
    """One line per site: each fused backend's time, GB/s, % of copy and speedup over the unfused sequence."""
    copy = result["copy"]["gbps"]
    meta = result["meta"]
    lines = [f"{meta['device']}, torch {meta['torch']}, triton {meta.get('triton', '-')}: copy {copy:.0f} GB/s; "
             "fused: ms / GB/s / % copy / x unfused",
             "| dtype | layout | op | site | unfused ms | " + " | ".join(meta["backends"]) + " | same |",
             "|---|---|---|---|---|" + "---|" * len(meta["backends"]) + "---|"]
    groups: dict[tuple, dict] = {}
    for r in result["rows"]:
        groups.setdefault((r["dtype"], r["layout"], r["op"], r["site"]), {})[r["impl"]] = r
    for (dtype, layout, op, site), g in groups.items():
        cells = []
        for b in meta["backends"]:
            r = g.get(b)
            cells.append("" if r is None else f"{r['time_ms']:.3g} / {r['gbps']:.0f} / {100 * r['gbps'] / copy:.0f}% "
                                              f"/ {r['speedup']:.2f}x")
        same = all(r.get("same_as_unfused", True) for r in g.values())
        lines.append(f"| {dtype} | {layout} | {op} | {site} | {g['unfused']['time_ms']:.3g} | " + " | ".join(cells)
                     + f" | {'ok' if same else 'NO'} |")
    for b in meta["backends"]:
        fused = [r for r in result["rows"] if r["impl"] == b and b not in ("torch", "reference")]
        low = [f"{r['dtype']}/{r['layout']}/{r['op']}/{r['site']} {100 * r['gbps'] / copy:.0f}%"
               for r in fused if r["gbps"] < TARGET_OF_COPY * copy]
        if fused:
            more = f" and {len(low) - 8} more" if len(low) > 8 else ""
            lines.append(f"{b}: {len(fused) - len(low)}/{len(fused)} sites at >= {TARGET_OF_COPY:.0%} of copy"
                         + (f"; below: {', '.join(low[:8])}{more}" if low else ""))
    checks = result["checks"]
    if checks:
        failed = [c for c in checks if not c["ok"]]
        lines.append(f"check vs the reference twin: {len(checks) - len(failed)}/{len(checks)} ok")
        lines += [f"  FAILED {c['backend']} {c['op']} {c['site']} {c['dtype']} {c['layout']} {c['variant']}: "
                  f"max abs diff {c['max_abs_diff']:.3e}" for c in failed[:10]]
    if meta["unavailable"]:
        lines.append("unavailable: " + "; ".join(meta["unavailable"]))
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--shape", default=None, choices=list(PRESETS),
                   help="site preset (default: small on CPU, wan22-720p on CUDA)")
    p.add_argument("--dtype", help="comma list of " + ", ".join(DTYPES) + " (default: the preset's)")
    p.add_argument("--kernels", default="auto", help="comma list of backends to time besides torch (default: auto)")
    p.add_argument("--layout", default="ncdhw", help="ncdhw, ndhwc, a comma list of them, or both")
    p.add_argument("--ops", help="comma list of ops to run (default: all): " + ", ".join(CHECK_VARIANTS))
    p.add_argument("--check", action="store_true", help="also check each fused backend against the reference twin")
    p.add_argument("--warmup", type=int)
    p.add_argument("--reps", type=int)
    p.add_argument("--copy-mib", type=int, help="size of the copy baseline (default 256 CPU, 2048 CUDA)")
    p.add_argument("--json", help="write rows, checks and metadata here")
    p.add_argument("--summarize", nargs="+", metavar="JSON", help="print the compact table of earlier --json runs")
    args = p.parse_args()
    if args.summarize:
        for path in args.summarize:
            print(compact(json.loads(Path(path).read_text())) + "\n")
        return 0
    args.shape = args.shape or ("wan22-720p" if args.device.startswith("cuda") else "small")
    args.dtype = args.dtype or DEFAULT_DTYPES[args.shape]
    for layout in ([] if args.layout == "both" else args.layout.split(",")):
        if layout not in LAYOUTS:
            p.error(f"--layout: {layout!r} is not one of {', '.join(LAYOUTS)} (or both)")
    t0 = time.perf_counter()
    with torch.no_grad():
        result = run(args)
    result["meta"]["wall_s"] = round(time.perf_counter() - t0, 1)
    print(markdown(result))
    print(f"wall {result['meta']['wall_s']} s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    bad = [r for r in result["rows"] if r.get("same_as_unfused") is False] + [c for c in result["checks"] if not c["ok"]]
    unavailable = args.check and result["meta"]["unavailable"] and args.kernels != "auto"
    return 1 if bad or unavailable else 0


if __name__ == "__main__":
    sys.exit(main())
