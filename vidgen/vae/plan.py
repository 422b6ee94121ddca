"""Choosing a decode plan (tile grid, frames per step) that fits a memory budget.

Compute: each tile grid's cost is the multiply-adds of every conv over the regions it really runs
on (tile cores plus halos), counted from the module's own weights. Memory: a plan's peak is
measured by running the decode of its largest tile for two chunks on fake tensors (memsim.py),
plus the phase-1 results it keeps. Grids are tried from cheapest to dearest; the first that fits
wins, or a leaner one within 3% of its compute.
"""

from __future__ import annotations

import json
import math
from collections.abc import MutableMapping
from dataclasses import dataclass

import torch

from ..config import parse_budget
from ..errors import VidgenError
from ..ops import op_table
from .decoder import DecodePlan, WanStreamingDecoder, _region, _upsampler, tile_grid
from .memsim import LiveBytes, fake_mode

AUTO_FRACTION = 0.7          # of free device memory, for "auto"
CPU_AUTO_CAP = 2**30         # "auto" on CPU: small tiles cost almost no time there (docs/vae.md)
CPU_RSS_FACTOR = 1.45        # CPU resident memory per live tensor byte (measured 1.40-1.42, docs/vae.md)
NEAR_CHEAPEST = 1.03         # plans within 3% of the cheapest compute count as equally fast
CPU_AUTO_WINDOW = 1.15       # "auto" on CPU: the leanest plan within 15% of the cheapest compute
FRAME_STEPS = (4, 1)
"""Frames each up block takes at a time, most first: a GPU plan takes the most its budget allows
(four frames a step, a whole latent frame's worth at the full-resolution stages, cuts the cache
hand-over traffic to a third); a CPU plan takes one, the leanest, at no cost in time (docs/vae.md)."""
MAX_TILES_PER_SIDE = 12


class BudgetTooSmall(VidgenError):
    """The memory budget is below what the smallest plan needs for this frame size."""


def free_memory(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free
    if device.type == "mps":
        return int(torch.mps.recommended_max_memory() - torch.mps.driver_allocated_memory())
    try:
        import psutil

        return psutil.virtual_memory().available
    except ImportError:
        import os

        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def format_bytes(n: float) -> str:
    if n >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    return f"{n / 2**20:.0f} MiB" if n >= 10 * 2**20 else f"{n / 2**20:.2f} MiB"


@dataclass(frozen=True)
class PlanEstimate:
    plan: DecodePlan
    peak_bytes: int       # expected activation peak on the device (weights excluded; CPU: resident memory)
    cost: float           # multiply-adds, relative units


def _stage_macs(decoder) -> list[float]:
    """Multiply-adds per pixel at each up block's input scale (and the head's), for one latent frame of
    the clip: each conv weighted by the frames it runs on. A Wan up block with a temporal upsample
    doubles the frames, so the stages see 1, 2, 4, 4 frames per latent frame, and the head 4."""
    out, frames = [], 1
    for block in decoder.up_blocks:
        macs = 0.0
        for res in block.resnets:
            for conv in (res.conv1, res.conv2):
                macs += conv.weight.numel() * frames
            if not isinstance(res.conv_shortcut, torch.nn.Identity):
                macs += res.conv_shortcut.weight.numel() * frames
        up = _upsampler(block)
        if up is not None:
            if up.mode == "upsample3d":     # the time conv runs on the block's frames and doubles them
                macs += up.time_conv.weight.numel() * frames
                frames *= 2
            macs += 4 * up.resample[1].weight.numel() * frames    # the conv2d runs on 4x the pixels
        out.append(macs)
    out.append(float(decoder.conv_out.weight.numel()) * frames)
    return out


def plan_cost(decoder, halos: list[int], scales: list[int], h: int, w: int, ny: int, nx: int) -> float:
    macs = _stage_macs(decoder)
    cost = 0.0
    for tile in tile_grid(h, w, ny, nx):
        for b, m in enumerate(macs):
            y0, y1 = _region(tile.y0, tile.y1, scales[b], halos[b], h)
            x0, x1 = _region(tile.x0, tile.x1, scales[b], halos[b], w)
            cost += m * (y1 - y0) * (x1 - x0)
    return cost


def _tile_area(tile, h: int, w: int, halos: list[int], scales: list[int]) -> int:
    """Pixels of the tile at the full-resolution stage, halo included: what dominates its memory."""
    y0, y1 = _region(tile.y0, tile.y1, scales[-1], halos[-2], h)
    x0, x1 = _region(tile.x0, tile.x1, scales[-1], halos[-2], w)
    return (y1 - y0) * (x1 - x0)


def _largest_tile(h: int, w: int, ny: int, nx: int, halos: list[int], scales: list[int]):
    return max(tile_grid(h, w, ny, nx), key=lambda t: _tile_area(t, h, w, halos, scales))


def simulate_plan_peak(vae, latent_shape: tuple[int, ...], dtype: torch.dtype, plan: DecodePlan,
                       device_type: str) -> int:
    """Expected peak activation bytes of `plan`: its largest tile's decode for two chunks on fake tensors,
    plus the mid results kept for the rest of the clip; on CPU scaled to resident memory.

    Runs the torch ops, whose workspaces LiveBytes adds (vidgen.ops.workspace_bytes), so the plan
    holds for every backend (the kernels need none)."""
    _, z, t, h, w = latent_shape
    dec = WanStreamingDecoder(vae, op_table("torch"))
    tile = _largest_tile(h, w, plan.ny, plan.nx, dec.halos, dec.scales)
    device = next(vae.parameters()).device
    with fake_mode():
        tracker = LiveBytes(device_type)
        latents = torch.empty(1, z, min(t, 2), h, w, dtype=dtype, device=device)
        with tracker, torch.no_grad():
            mids = dec.mid_frames(latents, on_host=False)
            mid_bytes = mids[0].numel() * mids[0].element_size()
            kept = 0 if plan.mid_on_host else mid_bytes * (t - len(mids))
            for _ in dec.tile_chunks(mids, tile, h, w, plan, device):
                pass
    peak = tracker.peak + kept
    return int(peak * CPU_RSS_FACTOR) if device_type == "cpu" else peak


def _simulated(vae, latent_shape, dtype, plan, device_type, memo: MutableMapping) -> int:
    key = ("decode peak", _config_key(vae), tuple(latent_shape), dtype, plan, device_type)
    if key not in memo:
        memo[key] = simulate_plan_peak(vae, latent_shape, dtype, plan, device_type)
    return memo[key]


def _config_key(vae) -> str:
    return json.dumps(dict(vae.config), sort_keys=True, default=str)


def _choose(vae, latent_shape, dtype, budget, device_type, mid_on_host, memo: MutableMapping,
            window: float = NEAR_CHEAPEST) -> PlanEstimate:
    """Grids from the least compute up; each with the most frames per step that fits. The first grid
    that fits wins, unless one within `window` of its compute fits leaner, or (on a GPU, where more
    frames per step move less cache data) with more frames per step. On the CPU frames per step cost
    no time (its convolutions all run through oneDNN, see decoder.conv3d), so it takes one frame a
    step, the leanest."""
    gpu = device_type == "cuda"
    steps = FRAME_STEPS if device_type != "cpu" else FRAME_STEPS[-1:]
    dec = WanStreamingDecoder(vae, op_table("torch"))
    _, _, _, h, w = latent_shape
    grids = sorted((plan_cost(dec.decoder, dec.halos, dec.scales, h, w, ny, nx), ny, nx)
                   for ny in range(1, min(h, MAX_TILES_PER_SIDE) + 1)
                   for nx in range(1, min(w, MAX_TILES_PER_SIDE) + 1))
    best: PlanEstimate | None = None
    failed = {}                      # frames per step -> the smallest largest-tile area that did not fit
    for cost, ny, nx in grids:
        if best is not None and cost > best.cost * window:
            break
        area = _tile_area(_largest_tile(h, w, ny, nx, dec.halos, dec.scales), h, w, dec.halos, dec.scales)
        for step in steps:
            if best is not None and step < best.plan.frames_per_step:
                break                # fewer frames per step than the best so far: not better
            if area > failed.get(step, math.inf):
                continue             # a smaller tile already did not fit at this step
            plan = DecodePlan(ny, nx, step, mid_on_host, gpu)
            peak = _simulated(vae, latent_shape, dtype, plan, device_type, memo)
            if peak > budget:
                failed[step] = min(failed.get(step, math.inf), area)
                continue
            if best is None or step > best.plan.frames_per_step or peak < best.peak_bytes:
                best = PlanEstimate(plan, peak, cost if best is None else best.cost)
            break                    # fewer frames per step on this grid would not be better
    if best is None:
        smallest = DecodePlan(h, w, FRAME_STEPS[-1], mid_on_host, gpu)
        need = _simulated(vae, latent_shape, dtype, smallest, device_type, memo)
        size = f"{w * dec.scales[-1] * dec.patch}x{h * dec.scales[-1] * dec.patch}"
        raise BudgetTooSmall(f"vae.memory_budget {format_bytes(budget)} is below the minimum for a {size} "
                             f"frame ({format_bytes(need)}); raise it or use 'auto'")
    return best


def choose_plan(vae, latent_shape: tuple[int, ...], *, memory_budget=None, device: torch.device | None = None,
                dtype: torch.dtype | None = None, memo: MutableMapping | None = None) -> PlanEstimate:
    """The plan for decoding latents of `latent_shape` [B, z, T, h, w] within `memory_budget`.

    memory_budget: None or "auto" (a fraction of free device memory) or bytes / "1.5GiB".
    memo: where plans and simulated peaks are kept for reuse (a Pipeline's preflight.Memo); None =
    for this call only.
    """
    param = next(vae.parameters())
    device = device or param.device
    dtype = dtype or param.dtype
    budget = parse_budget(memory_budget)
    window = NEAR_CHEAPEST
    if budget in (None, "auto"):
        window = CPU_AUTO_WINDOW if device.type == "cpu" else NEAR_CHEAPEST
        budget = int(AUTO_FRACTION * free_memory(device))
        if device.type == "cpu":
            budget = min(budget, CPU_AUTO_CAP)
        # Whole 256 MiB steps, so small changes in free memory reuse the cached plan.
        budget = max(64 << 20, budget >> 28 << 28)
    mid_on_host = device.type != "cpu"
    memo = {} if memo is None else memo
    key = ("decode plan", _config_key(vae), tuple(latent_shape), dtype, int(budget), device.type, window)
    if key not in memo:
        memo[key] = _choose(vae, tuple(latent_shape), dtype, int(budget), device.type, mid_on_host, memo, window)
    return memo[key]
