"""The fused VAE ops: every backend available here against the plain-PyTorch twins, and opcheck.

Triton kernels run on CUDA where there is one, else on the CPU under Triton's interpreter
(TRITON_INTERPRET=1, set in conftest.py before anything imports Triton). The Metal sources are
checked in test_kernels_metal.py.
"""

from __future__ import annotations

import pytest
import torch

from vidgen.errors import ConfigError
from vidgen.ops import reference as R
from vidgen.ops import metal_available, resolve_backend, triton_available, op_table

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(not triton_available(), reason="Triton is not installed (pip install triton)")
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _rand(shape, dtype, seed=0, layout="contiguous") -> torch.Tensor:
    """A test tensor in one of three layouts: contiguous, channels_last_3d, or a strided slice."""
    if layout == "slice":       # every other column and a frame offset of a larger tensor
        n, c, t, h, w = shape
        big = torch.randn(n, c, t + 1, h, 2 * w, generator=_gen(seed)) * 2
        return big[:, :, 1:, :, ::2].to(DEVICE, dtype)
    x = (torch.randn(shape, generator=_gen(seed)) * 2).to(DEVICE, dtype)
    return x.contiguous(memory_format=torch.channels_last_3d) if layout == "channels_last" else x


def _empty_like(x: torch.Tensor, layout: str, fill: float = float("nan")) -> torch.Tensor:
    out = torch.full(x.shape, fill, dtype=x.dtype, device=x.device)
    return out.contiguous(memory_format=torch.channels_last_3d) if layout == "channels_last" else out


def ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in units in the last place between same-dtype tensors (0 = bit-identical)."""
    ia, ib = a.contiguous().view(INT_VIEW[a.dtype]).long(), b.contiguous().view(INT_VIEW[b.dtype]).long()
    return int((ia - ib).abs().max().item()) if a.numel() else 0


@pytest.fixture(scope="module")
def triton_ops():
    if not triton_available():
        pytest.skip("Triton is not installed (pip install triton)")
    return op_table("triton", DEVICE)


SHAPES = [(1, 5, 1, 7, 9), (2, 7, 3, 5, 6), (1, 33, 2, 4, 17)]
LAYOUTS = ["contiguous", "channels_last", "slice"]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norm_silu_matches_twin(triton_ops, shape, layout, dtype):
    x = _rand(shape, dtype, 1, layout)
    gamma = (torch.rand(shape[1], generator=_gen(2)) + 0.5).to(DEVICE, dtype)
    for silu in (False, True):
        want, got = _empty_like(x, layout), _empty_like(x, layout)
        R.rms_norm_silu_into(x, gamma, want, silu=silu)
        triton_ops.rms_norm_silu_into(x, gamma, got, silu=silu)
        # the same float32 steps (exp included) and one rounding: bit-identical in every dtype
        assert ulps(got, want) == 0, (silu, ulps(got, want))


def test_rms_norm_twin_follows_diffusers():
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanRMS_norm

    norm = WanRMS_norm(24, images=False)
    norm.gamma.data.uniform_(0.5, 1.5)
    x = torch.randn(1, 24, 3, 9, 10, generator=_gen(3)) * 3
    out = torch.empty_like(x)
    R.rms_norm_silu_into(x, norm.gamma, out)
    assert (out - torch.nn.functional.silu(norm(x))).abs().max() <= 1e-6


@pytest.mark.parametrize("dtype", FLOATS)
def test_rms_norm_silu_matches_twin_across_exps_range(triton_ops, dtype):
    # gamma up to +-100: SiLU's argument passes exp's clamp at +-87 on both sides
    x = _rand((1, 33, 2, 4, 17), dtype, 7)
    gamma = torch.linspace(-100, 100, 33).to(DEVICE, dtype)
    want, got = torch.empty_like(x), torch.empty_like(x)
    R.rms_norm_silu_into(x, gamma, want, silu=False)
    assert want.float().max() > 88 and want.float().min() < -88
    R.rms_norm_silu_into(x, gamma, want)
    triton_ops.rms_norm_silu_into(x, gamma, got)
    assert ulps(got, want) == 0


def test_exp_f32_is_within_an_ulp_of_exp():
    x = torch.linspace(-87, 88, 1_000_001)
    assert ulps(R.exp_f32(x), torch.exp(x.double()).float()) <= 1
    edge = R.exp_f32(torch.tensor([float("nan"), -1e4, 1e4, -87.0, 88.0, 0.0]))
    assert edge[0].isnan() and edge[1] == edge[3] and edge[2] == edge[4] and edge[5] == 1.0
    y = torch.randn(2, 40, 3, 5, 5, generator=_gen(8)) * 30
    assert (R.silu_f32_(y.clone()) - torch.nn.functional.silu(y)).abs().max() <= 4e-6


def test_silu_groups_change_no_bit(monkeypatch):
    y = torch.randn(1, 20, 1, 400, 400, generator=_gen(9)) * 8
    assert R.silu_group(20, 400 * 400) == 8                   # three groups: 8, 8, 4 channels
    grouped = R.silu_f32_(y.clone())
    monkeypatch.setattr(R, "SILU_ELEMENTS", 1 << 30)
    assert R.silu_group(20, 400 * 400) == 20 and torch.equal(R.silu_f32_(y.clone()), grouped)


def test_twin_workspace_is_what_the_planner_counts():
    """workspace_bytes (what the memory planner adds for each op) covers the temporaries of both
    PyTorch backends: the fast one (`vidgen::rms_norm_silu_into`) and the reference twin."""
    from vidgen.ops import fast, workspace_bytes
    from vidgen.vae.memsim import LiveBytes

    for dtype, shape in ((torch.float32, (1, 40, 2, 9, 11)), (torch.bfloat16, (1, 40, 3, 9, 11)),
                         (torch.float32, (1, 5, 1, 30, 40)), (torch.float32, (1, 20, 1, 400, 400)),
                         (torch.bfloat16, (1, 20, 2, 400, 400))):         # the last two: SiLU in groups
        x = torch.randn(shape).to(dtype)
        gamma, out = torch.ones(shape[1], dtype=dtype), torch.empty_like(x)
        for op, fn in (("rms_norm_silu_into_reference", R.rms_norm_silu_into),
                       ("rms_norm_silu_into", fast.rms_norm_silu_into)):
            with LiveBytes("cuda") as live:
                for t in (x, gamma, out):               # made before: not the op's workspace
                    live.track(t)
                start = live.current
                fn(x, gamma, out)
            used = live.peak - start
            assert 0 < used <= live._rounded(workspace_bytes(op, (x, gamma, out))), (op, dtype, shape)


def test_fast_torch_backend_follows_diffusers_and_the_twin():
    """kernels=torch (vectorised, the CPU default) against diffusers' WanRMS_norm + SiLU and the
    reference twin, in every dtype and layout; its ops that move data are the twin's."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanRMS_norm

    from vidgen.ops import fast

    norm = WanRMS_norm(24, images=False)
    norm.gamma.data.uniform_(0.5, 1.5)
    for layout in LAYOUTS:
        x = _rand((1, 24, 3, 9, 10), torch.float32, 3, layout).cpu() * 3
        for silu in (False, True):
            got, want = _empty_like(x, layout), _empty_like(x, layout)
            fast.rms_norm_silu_into(x, norm.gamma, got, silu=silu)
            R.rms_norm_silu_into(x, norm.gamma, want, silu=silu)
            ref = torch.nn.functional.silu(norm(x)) if silu else norm(x)
            assert (got - ref).abs().max() <= 1e-5 and (got - want).abs().max() <= 1e-5, (layout, silu)
    for dtype in (torch.bfloat16, torch.float16):
        x = (torch.randn(1, 24, 2, 5, 6, generator=_gen(4)) * 3).to(dtype)
        got, want = torch.empty_like(x), torch.empty_like(x)
        fast.rms_norm_silu_into(x, norm.gamma.to(dtype), got)
        R.rms_norm_silu_into(x, norm.gamma.to(dtype), want)
        assert ulps(got, want) <= 1, dtype          # both compute in float32 and round once
    assert all(getattr(fast, op) is getattr(R, op) for op in
               ("causal_cache_shift", "window_gather", "upsample_nearest2x_into", "dup_up_add"))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("t", [1, 2, 5])
def test_causal_cache_shift_matches_twin(triton_ops, t, layout, dtype):
    for first in (True, False):
        buf = _rand((1, 6, 2 + t, 5, 7), dtype, 4, layout)
        cache = _rand((1, 6, 2, 5, 7), dtype, 5, layout)
        bufs, caches = (buf.clone(), buf.clone()), (cache.clone(), cache.clone())
        R.causal_cache_shift(bufs[0], caches[0], first)
        triton_ops.causal_cache_shift(bufs[1], caches[1], first)
        assert torch.equal(bufs[0], bufs[1]) and torch.equal(caches[0], caches[1]), first


def test_causal_cache_shift_carries_frames_across_chunks():
    """Chunks of 1, 3 and 2 frames through the op give [0, 0, f0, f1, ...] windows, as Wan's cat + pad."""
    frames = torch.randn(1, 2, 6, 3, 3, generator=_gen(6))
    cache = torch.empty(1, 2, 2, 3, 3)
    padded = torch.cat([torch.zeros(1, 2, 2, 3, 3), frames], dim=2)
    start = 0
    for i, t in enumerate((1, 3, 2)):
        buf = torch.empty(1, 2, 2 + t, 3, 3)
        buf[:, :, 2:] = frames[:, :, start:start + t]
        R.causal_cache_shift(buf, cache, first=i == 0)
        assert torch.equal(buf, padded[:, :, start:start + 2 + t])
        start += t


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("window", [(0, 0, 5, 7), (-2, 3, 6, 8), (4, -3, 3, 3), (7, 9, 2, 2)])
def test_window_gather_matches_twin(triton_ops, window, layout, dtype):
    y0, x0, h, w = window
    src = _rand((1, 3, 2, 7, 9), dtype, 7, layout)
    want = _empty_like(src[..., :h, :w], layout)
    got = _empty_like(src[..., :h, :w], layout)
    R.window_gather(src, want, y0, x0)
    triton_ops.window_gather(src, got, y0, x0)
    assert torch.equal(want, got)
    inside = src[..., max(y0, 0):y0 + h, max(x0, 0):x0 + w]
    assert torch.equal(want[..., max(-y0, 0):, max(-x0, 0):][..., :inside.shape[-2], :inside.shape[-1]], inside)
    assert (want != 0).sum() == (inside != 0).sum()      # the rest is zero fill


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_upsample_matches_twin_and_interpolate(triton_ops, layout, dtype):
    x = _rand((1, 4, 3, 5, 7), dtype, 8, layout)
    want = _empty_like(torch.empty(1, 4, 3, 10, 14, dtype=dtype, device=DEVICE), layout)
    got = want.clone()
    R.upsample_nearest2x_into(x, want)
    triton_ops.upsample_nearest2x_into(x, got)
    assert torch.equal(want, got)
    ref = torch.nn.functional.interpolate(x.float(), scale_factor=(1, 2, 2), mode="nearest-exact").to(dtype)
    assert torch.equal(want, ref)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("first", [True, False])
@pytest.mark.parametrize("channels", [(8, 4), (12, 12), (6, 3)])
def test_dup_up_add_matches_twin_and_diffusers(triton_ops, channels, first, dtype):
    from diffusers.models.autoencoders.autoencoder_kl_wan import DupUp3D

    ci, co = channels
    dup = DupUp3D(ci, co, factor_t=2, factor_s=2)
    x = _rand((1, ci, 3, 4, 5), dtype, 9)
    y = _rand((1, co, 6 - first, 8, 10), dtype, 10, "slice")
    want, got = y.clone(), y.clone()
    R.dup_up_add(want, x, 2, 2, first)
    triton_ops.dup_up_add(got, x, 2, 2, first)
    assert torch.equal(want, got)
    assert torch.equal(want, y + dup(x, first_chunk=first))


def test_kernels_check_shapes(triton_ops):
    x = torch.zeros(1, 4, 2, 3, 3, device=DEVICE)
    with pytest.raises(ValueError, match="gamma must hold C=4"):
        triton_ops.rms_norm_silu_into(x, torch.ones(3, device=DEVICE), torch.empty_like(x))
    with pytest.raises(ValueError, match="out must be"):
        triton_ops.upsample_nearest2x_into(x, torch.empty(1, 4, 2, 6, 5, device=DEVICE))
    # factor_t = 0 with first=True fits the shape arithmetic, but the kernel would divide by zero
    with pytest.raises(ValueError, match="must be >= 1"):
        triton_ops.dup_up_add(torch.zeros(1, 4, 1, 6, 6, device=DEVICE), torch.zeros(1, 4, 2, 3, 3, device=DEVICE),
                              0, 2, True)


# ------------------------------------------------------------------------------------ opcheck


def _samples(dev):
    x = torch.randn(1, 5, 2, 3, 4, generator=_gen(11)).to(dev)
    buf = torch.randn(1, 5, 4, 3, 4, generator=_gen(12)).to(dev)
    yield "rms_norm_silu_into", (x, torch.rand(5).to(dev), buf[:, :, 2:]), {"silu": True}
    yield "causal_cache_shift", (buf.clone(), torch.randn(1, 5, 2, 3, 4).to(dev), False), {}
    yield "window_gather", (x, torch.empty(1, 5, 2, 4, 4, device=dev), -1, 1), {}
    yield "upsample_nearest2x_into", (x, torch.empty(1, 5, 2, 6, 8, device=dev)), {}
    yield "dup_up_add", (torch.randn(1, 5, 3, 6, 8).to(dev), torch.randn(1, 20, 2, 3, 4).to(dev), 2, 2, True), {}


@pytest.mark.parametrize("backend", [
    "torch", "reference", pytest.param("triton", marks=needs_triton),
    pytest.param("metal", marks=pytest.mark.skipif(not metal_available(), reason="needs an Apple GPU (MPS)"))])
def test_opcheck(backend):
    """Schema, fake (torch.compile) and dispatch registration of every op, per backend."""
    dev = "mps" if backend == "metal" else DEVICE
    ops = op_table(backend, dev)
    for name, args, kwargs in _samples(dev):
        torch.library.opcheck(getattr(ops, name), args, kwargs)


# ------------------------------------------------------------------------------- backend choice


def test_backend_choice():
    assert resolve_backend("auto", "cpu") == "torch"
    assert resolve_backend("torch", "cpu") == "torch"
    assert resolve_backend("reference", "cpu") == "reference"
    with pytest.raises(ConfigError, match="vae.kernels: 'cuda' is not one of auto, torch, reference, triton, metal"):
        resolve_backend("cuda", "cpu")
    with pytest.raises(ConfigError, match="metal runs on Apple GPUs"):
        resolve_backend("metal", "cpu")


@pytest.mark.parametrize("installed", [True, False])
def test_triton_on_cpu_needs_the_interpreter(monkeypatch, installed):
    """Both refusals, whether or not Triton is installed here (its presence is stood in for)."""
    import vidgen.ops

    monkeypatch.setattr(vidgen.ops, "triton_available", lambda: installed)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    match = "triton runs on CUDA devices, not cpu" if installed else "triton needs Triton installed"
    with pytest.raises(ConfigError, match=match):
        resolve_backend("triton", "cpu")
    if installed:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        assert resolve_backend("triton", "cpu") == "triton"


@pytest.mark.slow
def test_gpu_kernels_script_smoke_mode_runs():
    """The prepared GPU script (bench/gpu_kernels.sh, the first run on a lent device) on the CPU at tiny
    sizes, through the Triton interpreter: every stage ends ok and the summary is printed."""
    import os
    import subprocess
    from pathlib import Path

    pytest.importorskip("triton")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(["bash", str(root / "bench" / "gpu_kernels.sh")], capture_output=True, text=True,
                          timeout=600, cwd=root, env={**os.environ, "SMOKE": "1"})
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-2000:]
    for stage in ("kernels-bf16", "kernels-fp32", "decode", "profile"):
        assert f"{stage}: ok" in out, out[-2000:]
