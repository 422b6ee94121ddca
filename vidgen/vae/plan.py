"""Choosing a decode plan (tile grid, frames per step) that fits a memory budget.

Compute: each tile grid's cost is the multiply-adds of every conv over the regions it really runs
on (tile cores plus halos), counted from the module's own weights. Memory: a plan's peak is
measured by running the decode of its largest tile for two chunks on fake tensors (memsim.py),
plus the phase-1 results it keeps. Grids are tried from cheapest to dearest; the first that fits
wins, or a leaner one within 3% of its compute. On the CPU, where a tight budget would otherwise
cost recompute, plans that keep the phase-1 results in a temporary file are tried too
(_choose_spilling).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from torch._subclasses.fake_tensor import unset_fake_temporarily

from .. import budgets
from ..budgets import Budget, format_bytes
from ..errors import VidgenError
from ..memo import Memo
from ..ops import op_table
from .decoder import DecodePlan, PhaseOneFile, WanStreamingDecoder, _region, _upsampler, tile_grid
from .memsim import LiveBytes, config_key, counting_ops, meta_copy

AUTO_FRACTION = 0.7          # of free device memory, for "auto"
CPU_AUTO_CAP = 2**30         # "auto" on CPU: small tiles cost almost no time there (docs/vae.md)
CPU_RSS_FACTOR = 1.2         # CPU resident memory per live tensor byte: glibc's heap slack (docs/vae.md)
CPU_RSS_FIXED = 36 << 20     # and once per decode: oneDNN's first primitives, the heap's first growth (docs/vae.md)
NEAR_CHEAPEST = 1.03         # plans within 3% of the cheapest compute count as equally fast
CPU_AUTO_WINDOW = 1.09       # "auto" on CPU: the leanest plan within 9% of the least compute (docs/vae.md)
FRAME_STEPS = (4, 1)
"""Frames each up block takes at a time, most first: a GPU plan takes the most its budget allows
(four frames a step, a whole latent frame's worth at the full-resolution stages, cuts the cache
hand-over traffic to a third); a CPU plan takes one, the leanest, at no cost in time (docs/vae.md)."""
MAX_TILES_PER_SIDE = 12


class BudgetTooSmall(VidgenError):
    """The memory budget is below what the smallest plan needs for this frame size (`minimum` bytes)."""

    minimum: int = 0


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


def plan_cost(decoder, halos: list[int], scales: list[int], h: int, w: int, ny: int, nx: int,
              tile_from: int = 0, macs: list[float] | None = None) -> float:
    """Multiply-adds of a plan (relative units): up blocks before `tile_from` once over the whole
    frame, the rest over every tile's region (core plus halo). `macs`: _stage_macs(decoder), if known."""
    macs = macs or _stage_macs(decoder)
    cost = sum(m * h * w * scales[b] ** 2 for b, m in enumerate(macs[:tile_from]))
    for tile in tile_grid(h, w, ny, nx):
        for b, m in enumerate(macs[tile_from:], tile_from):
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


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def simulate_plan_peak(vae, latent_shape: tuple[int, ...], dtype: torch.dtype, plan: DecodePlan,
                       device_type: str, memo: Memo | None = None) -> int:
    """Expected peak activation bytes of `plan`: phase 1 and its largest tile's decode for two chunks
    on meta tensors (a meta copy of the VAE), plus the phase-1 results kept for the rest of the clip; on CPU scaled to
    resident memory.

    With `plan.mid_on_host` the phase-1 results live on the host as they are made: phase 1 counts only
    the frame in flight, the tiles only their crop's copy on the device. With `plan.mid_in_file` they
    go to a file: phase 1 counts the frame in flight and the crop being written, the tiles the crop
    read back.

    The memory-bound ops only count the torch backend's workspaces (memsim.counting_ops,
    vidgen.ops.workspace_bytes), so the plan holds for every backend (the kernels need none).
    `memo`: where the meta copy and phase 1's runs are kept (None: for this call only)."""
    memo = Memo() if memo is None else memo
    _, z, t, h, w = latent_shape
    trackers: list[LiveBytes] = []
    dec = WanStreamingDecoder(meta_copy(vae, memo), counting_ops(trackers), plan.subpixel)
    tile = _largest_tile(h, w, plan.ny, plan.nx, dec.halos, dec.scales)
    meta = torch.device("meta")
    with unset_fake_temporarily():
        first_peak, first_live, mids = _phase_one(vae, dec, (1, z, min(t, 2), h, w), dtype, plan, device_type,
                                                  trackers, memo)
        apart = plan.mid_in_file or plan.mid_on_host    # phase-1 results off the device: the tiles count apart
        tiles = LiveBytes(device_type)
        if not apart:               # the tiles decode beside phase 1's results, from its high-water mark
            tiles.current, tiles.peak = first_live, first_peak
        trackers[:] = [tiles]
        with tiles, torch.no_grad():
            for _ in dec.tile_chunks(mids, tile, h, w, plan, meta):
                pass
    if plan.mid_in_file:            # nothing kept: each tile reads its crop back, one frame at a time
        peak = max(first_peak, tiles.peak)
    elif plan.mid_on_host:          # phase 1: the frame in flight; the tiles: their crop's copy on the device
        per_frame = _nbytes(mids[-1])           # a latent frame after the first (t > 1)
        y0, y1, x0, x1 = dec.crop(tile, plan.tile_from, h, w)
        phase1 = first_peak - sum(_nbytes(m) for m in mids[:-1])
        peak = max(phase1, tiles.peak + per_frame * (y1 - y0) * (x1 - x0) // (mids[-1].shape[-2] * mids[-1].shape[-1]))
    else:
        peak = tiles.peak + _nbytes(mids[-1]) * (t - len(mids))
    return _resident(peak, device_type)


def _resident(peak: int, device_type: str) -> int:
    """Simulated live bytes as the process holds them: on the CPU, resident memory (glibc's slack)."""
    return int(peak * CPU_RSS_FACTOR + CPU_RSS_FIXED) if device_type == "cpu" else peak


def kept_floor(vae, latent_shape: tuple[int, ...], dtype: torch.dtype, plan: DecodePlan, device_type: str,
               memo: Memo | None = None) -> int:
    """A lower bound of simulate_plan_peak for a plan that keeps phase 1's results where it decodes:
    phase 1's high-water mark plus the results of the frames it did not run, from the memo's phase-1
    runs (shared by every tile grid of its depth), with no tile decoded."""
    memo = Memo() if memo is None else memo
    _, z, t, h, w = latent_shape
    trackers: list[LiveBytes] = []
    dec = WanStreamingDecoder(meta_copy(vae, memo), counting_ops(trackers), plan.subpixel)
    with unset_fake_temporarily():
        peak, _, mids = _phase_one(vae, dec, (1, z, min(t, 2), h, w), dtype, plan, device_type, trackers, memo)
    return _resident(peak + _nbytes(mids[-1]) * (t - len(mids)), device_type)


PHASE_ONE = ("decode phase one", 64)
"""The memo part keeping phase 1 of simulated decodes, shared by the plans that run it alike (the same
clip, phase-1 depth, frames per step and upsample): its high-water mark, the bytes live after it, and
its results (meta tensors, no memory). A tight budget walks hundreds of tile grids; their phase 1 is a
handful."""


def _phase_one(vae, dec, latent_shape, dtype, plan, device_type, trackers, memo: Memo) -> tuple[int, int, list]:
    """(peak bytes, bytes live after, results) of phase 1 of `plan` on meta latents of `latent_shape`,
    counted by a LiveBytes put in `trackers` (the innermost, which dec's counting ops charge); from
    the memo's PHASE_ONE part where it was run before. A plan that keeps the results in a file runs it
    each time: what it writes depends on the tile grid."""
    key = (config_key(vae), tuple(latent_shape), dtype, plan.tile_from, plan.tile_from and plan.frames_per_step,
           plan.subpixel, device_type)
    runs = memo.part(*PHASE_ONE)
    if not plan.mid_in_file and key in runs:
        return runs[key]
    first = LiveBytes(device_type)
    trackers[:] = [first]
    _, _, _, h, w = latent_shape
    latents = torch.empty(latent_shape, dtype=dtype, device=torch.device("meta"))
    store = PhaseOneFile(dec.crop_regions(plan, h, w), simulate=True) if plan.mid_in_file else None
    with first, torch.no_grad():
        mids = dec.mid_frames(latents, on_host=False, plan=plan, store=store)
    result = first.peak, first.current, mids
    if not plan.mid_in_file:
        runs[key] = result
    return result


def host_bytes(vae, latent_shape: tuple[int, ...], dtype: torch.dtype, plan: DecodePlan, dec=None) -> int:
    """Bytes of the phase-1 results a `mid_on_host` plan keeps in host memory for the whole clip."""
    _, _, t, h, w = latent_shape
    dec = dec or WanStreamingDecoder(vae, op_table("torch"))
    scale = dec.scales[plan.tile_from]
    width = _stage_width(dec.decoder, plan.tile_from)
    frames = 1 + (t - 1) * 2 ** _temporal_ups(dec.decoder, plan.tile_from)
    return frames * width * h * w * scale ** 2 * torch.empty(0, dtype=dtype).element_size()


def _stage_width(decoder, b: int) -> int:
    if b == 0:
        return decoder.mid_block.resnets[-1].conv2.out_channels
    up = _upsampler(decoder.up_blocks[b - 1])
    return up.resample[1].out_channels if up is not None else decoder.up_blocks[b - 1].resnets[-1].conv2.out_channels


def _temporal_ups(decoder, b: int) -> int:
    return sum(1 for block in decoder.up_blocks[:b]
               if _upsampler(block) is not None and _upsampler(block).mode == "upsample3d")


def _tile_regions(dec, h: int, w: int, ny: int, nx: int, tile_from: int) -> tuple:
    """The shapes of the largest tile's regions at each tiled stage (halo included) and of its core:
    what a plan's peak depends on, not where the tile sits."""
    tile = _largest_tile(h, w, ny, nx, dec.halos, dec.scales)
    regions = []
    for b in range(tile_from, len(dec.scales)):
        y0, y1, x0, x1 = dec.crop(tile, b, h, w)
        regions.append((y1 - y0, x1 - x0))
    return (*regions, (tile.y1 - tile.y0, tile.x1 - tile.x0))


def _sim_key(dec, model, latent_shape, dtype, plan, device_type) -> tuple:
    """What a plan's simulated peak depends on: the clip, the phase-1 stages, and the shapes of its
    largest tile's regions, so grids with the same largest tile share one."""
    _, _, t, h, w = latent_shape
    return ("decode peak", model, tuple(latent_shape), dtype, plan.frames_per_step, plan.mid_on_host,
            plan.mid_in_file, plan.subpixel, plan.tile_from, device_type,
            _tile_regions(dec, h, w, plan.ny, plan.nx, plan.tile_from))


SIMULATED = ("decode peaks", 4096)
"""The memo part keeping simulated peaks, shared by every plan choice under one memo: each is a pure
function of its key (the model's config and shapes), a few dozen bytes, and costs a meta-tensor decode
to make."""


def _simulated(vae, model, latent_shape, dtype, plan, device_type, dec, memo: Memo) -> int:
    """`plan`'s simulated peak, from the memo's SIMULATED part when known; `model` is config_key(vae),
    `dec` the planner's decoder (its halos and scales)."""
    key = _sim_key(dec, model, latent_shape, dtype, plan, device_type)
    return memo.part(*SIMULATED).cached(key, lambda: simulate_plan_peak(vae, latent_shape, dtype, plan, device_type,
                                                                        memo))


def takes_subpixel(device_type: str, dtype: torch.dtype) -> bool:
    """Whether plans for this device and dtype run upsample convs as four 2x2 convs (DecodePlan.subpixel):
    on the CPU in 32-bit floats, where it was measured faster; 16-bit weights would round the folded taps."""
    return device_type == "cpu" and dtype.itemsize >= 4


def _choose(vae, latent_shape, dtype, budget, device_type, mid_on_host, window: float = NEAR_CHEAPEST,
            host_limit: int | None = None, output: int = 0, from_least: bool = False,
            mid_in_file: bool = False, memo: Memo | None = None) -> PlanEstimate:
    """Plans (tile grid, up blocks run whole first) from the least compute up; each with the most
    frames per step that fits. The first plan that fits wins, unless one within `window` of its
    compute fits leaner, or (on a GPU, where more frames per step move less cache data) with more
    frames per step. `from_least`: the window counts from the least compute of all plans, fitting
    or not (the first that fits is still taken when it lies outside). On the CPU frames per step cost no time (its convolutions all run through
    oneDNN, see decoder.conv3d), so it takes one frame a step, the leanest.

    A plan's peak grows with its largest tile's regions, so a plan whose regions are at least those
    of one that did not fit (at every stage, same frames per step and phase-1 depth) is skipped
    without a simulation. The tile's area alone does not order the peaks: a 2x2 grid's corner tile
    reaches less far into the wide low stages than a 2x3 grid's middle column. `memo`: where the
    simulations are kept (None: for this call only)."""
    memo = Memo() if memo is None else memo
    gpu = device_type == "cuda"
    subpixel = takes_subpixel(device_type, dtype)
    steps = FRAME_STEPS if device_type != "cpu" else FRAME_STEPS[-1:]
    dec = WanStreamingDecoder(vae, op_table("torch"))
    _, _, _, h, w = latent_shape
    model = config_key(vae)
    depths = range(len(dec.decoder.up_blocks))

    def peak_of(ny, nx, step, k, budget=math.inf):
        """(plan, its peak), or math.inf for a plan sure to exceed `budget` (not simulated)."""
        plan = DecodePlan(ny, nx, step, mid_on_host, gpu, k, mid_in_file, subpixel)
        if mid_on_host and host_limit is not None and host_bytes(vae, latent_shape, dtype, plan, dec) > host_limit:
            return plan, math.inf
        if (not (mid_on_host or mid_in_file)
                and kept_floor(vae, latent_shape, dtype, plan, device_type, memo) + output > budget):
            return plan, math.inf    # phase 1 alone outgrows the budget, whatever the tile grid
        return plan, _simulated(vae, model, latent_shape, dtype, plan, device_type, dec, memo) + output

    finest = (min(h, MAX_TILES_PER_SIDE), min(w, MAX_TILES_PER_SIDE))     # the leanest grid tried
    floor_plan, need = min((peak_of(*finest, FRAME_STEPS[-1], k) for k in (depths if finest != (1, 1) else (0,))),
                           key=lambda plan_peak: plan_peak[1])
    if need > budget:            # refused before walking the plans: no plan is leaner than these
        size = f"{w * dec.scales[-1] * dec.patch}x{h * dec.scales[-1] * dec.patch}"
        err = BudgetTooSmall(f"vae.memory_budget {format_bytes(budget)} is below the minimum for a {size} "
                             f"frame ({format_bytes(need, up=True)}); raise it or use 'auto'")
        err.minimum = int(need)
        raise err
    best = _walk(dec, h, w, steps, budget, window, from_least, peak_of)
    if best is None:             # only if a peak grew as a tile shrank: the finest grid is still the floor
        best = PlanEstimate(floor_plan, need, math.inf)
    return best


def _grids(dec, h: int, w: int) -> list[tuple[float, int, int, int, int]]:
    """Every plan's (compute, largest tile's area, tile rows, columns, phase-1 depth), the least compute first."""
    depths = range(len(dec.decoder.up_blocks))
    macs = _stage_macs(dec.decoder)
    return sorted((plan_cost(dec.decoder, dec.halos, dec.scales, h, w, ny, nx, k, macs),
                   _tile_area(_largest_tile(h, w, ny, nx, dec.halos, dec.scales), h, w, dec.halos, dec.scales),
                   ny, nx, k)
                  for ny in range(1, min(h, MAX_TILES_PER_SIDE) + 1)
                  for nx in range(1, min(w, MAX_TILES_PER_SIDE) + 1)
                  for k in (depths if ny * nx > 1 else (0,)))


def _walk(dec, h: int, w: int, steps: tuple[int, ...], budget: int, window: float, from_least: bool,
          peak_of) -> PlanEstimate | None:
    """_choose's walk of the plans from the least compute up (`peak_of(ny, nx, step, k, budget)`: a
    plan and its peak); None when none fits."""
    plans = _grids(dec, h, w)
    failed: dict[tuple[int, int], list[tuple]] = {}   # (frames per step, depth) -> regions that did not fit

    def too_big(regions: tuple, step: int, k: int) -> bool:
        """Whether a plan's largest tile covers, at every stage, at least the regions of one that
        did not fit at this step and depth: its peak cannot be lower (no simulation needed)."""
        return any(all(a >= b for a, b in zip(sum(regions, ()), sum(f, ()))) for f in failed.get((step, k), ()))

    best: PlanEstimate | None = None
    for cost, area, ny, nx, k in plans:
        if best is not None and cost > (plans[0][0] if from_least else best.cost) * window:
            break
        for step in steps:
            if best is not None and step < best.plan.frames_per_step:
                break                # fewer frames per step than the best so far: not better
            regions = _tile_regions(dec, h, w, ny, nx, k)
            if too_big(regions, step, k):
                continue             # a tile no larger at any stage already did not fit
            plan, peak = peak_of(ny, nx, step, k, budget)
            if peak > budget:
                failed.setdefault((step, k), []).append(regions)
                continue
            if best is None or step > best.plan.frames_per_step or peak < best.peak_bytes:
                best = PlanEstimate(plan, peak, cost if best is None else best.cost)
            break                    # fewer frames per step on this plan would not be better
    return best


def choose_plan(vae, latent_shape: tuple[int, ...], *, memory_budget: Budget | None = None,
                device: torch.device | None = None, dtype: torch.dtype | None = None, memo: Memo | None = None,
                output_bytes: int = 0) -> PlanEstimate:
    """The plan for decoding latents of `latent_shape` [B, z, T, h, w] within `memory_budget`.

    memory_budget: bytes, or None / "auto" (a fraction of free device memory), parsed already
    (budgets.parse_budget).
    memo: where chosen plans and the simulations behind them are kept for reuse (a Pipeline's
    memo.Memo, in its "decode plans", SIMULATED and PHASE_ONE parts); None = for this call only.
    output_bytes: the result the caller assembles in host memory (decode's video, decode_frames'
    canvas), counted against a CPU budget; a GPU plan keeps its phase-1 results on the host only
    where they fit in half the free host memory.
    """
    param = next(vae.parameters())
    device = device or param.device
    dtype = dtype or param.dtype
    budget = memory_budget
    window, from_least = NEAR_CHEAPEST, False
    if budget in (None, "auto"):
        if device.type == "cpu":
            window, from_least = CPU_AUTO_WINDOW, True
        budget = int(AUTO_FRACTION * budgets.free_memory(device))
        if device.type == "cpu":
            budget = min(budget, CPU_AUTO_CAP)
        # Whole 256 MiB steps, so small changes in free memory reuse the cached plan.
        budget = max(64 << 20, budget >> 28 << 28)
    mid_on_host = device.type != "cpu"
    memo = Memo() if memo is None else memo
    output = output_bytes if device.type == "cpu" else 0
    host_limit = budgets.free_memory(torch.device("cpu")) // 2 if mid_on_host else None
    if host_limit is not None:
        host_limit = host_limit >> 28 << 28        # whole 256 MiB steps, as the budget
    key = (config_key(vae), tuple(latent_shape), dtype, int(budget), device.type, window, output, host_limit)
    args = (vae, tuple(latent_shape), dtype, int(budget), device.type, mid_on_host, window, host_limit, output,
            from_least)
    return memo.part("decode plans", 256).cached(
        key, lambda: _choose_spilling(*args, memo=memo) if device.type == "cpu" else _choose(*args, memo=memo))


SPILL_SAVING = 1.1
"""A CPU plan keeps its phase-1 results in a temporary file (DecodePlan.mid_in_file) only where the
budget cannot hold them beside a tile's decode at a cost within this factor of the file plan's: the
file's writes and reads are page-cache copies, a few ms per MiB against seconds of convolutions."""


def _choose_spilling(vae, latent_shape, *args, memo: Memo) -> PlanEstimate:
    """_choose on the CPU: phase-1 results in memory, or in a temporary file where that saves more
    than SPILL_SAVING of the compute the budget would otherwise cost (or is the only plan that fits)."""
    dec = WanStreamingDecoder(vae, op_table("torch"))
    _, _, _, h, w = latent_shape

    def cost(est: PlanEstimate) -> float:
        p = est.plan
        return plan_cost(dec.decoder, dec.halos, dec.scales, h, w, p.ny, p.nx, p.tile_from)

    least = plan_cost(dec.decoder, dec.halos, dec.scales, h, w, 1, 1, 0)
    try:
        kept = _choose(vae, latent_shape, *args, memo=memo)
    except BudgetTooSmall as err:
        kept, refusal = None, err
    if kept is not None and cost(kept) <= least * SPILL_SAVING:
        return kept              # nothing worth saving
    try:
        spilled = _choose(vae, latent_shape, *args, mid_in_file=True, memo=memo)
    except BudgetTooSmall as err:
        if kept is not None:
            return kept
        raise min(refusal, err, key=lambda e: e.minimum) from None
    return spilled if kept is None or cost(spilled) * SPILL_SAVING < cost(kept) else kept
