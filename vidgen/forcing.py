"""Diffusion forcing (SkyReels-V2 DF): a noise level per latent frame, and a long take in one render.

The semantics are those of diffusers' SkyReelsV2DiffusionForcingPipeline, on vidgen's solvers and checkpoints:

- **Windows.** A take longer than the model's window (`forcing.base_num_frames`, else the model's clip
  length) is made in windows of that many latent frames. Each window after the first starts on the last
  `overlap_history` frames of the take so far, as latents: never decoded and encoded again. Only its new
  frames are added to the take, so the shared frames appear once.
- **The timestep matrix.** Inside a window every frame follows diffusers' own `generate_timestep_matrix`.
  Row r gives each frame's timestep at model call r. With ar_step 0 all frames move together
  (synchronous). With ar_step N each causal block of `causal_block_size` frames trails the one before
  by N steps (asynchronous): the earlier frames are cleaner, and the transformer's block-causal
  attention lets each block see only the blocks before it.
- **A solver per frame.** Diffusers keeps a UniPC scheduler per frame. Here each frame's history (its
  last two x0 and its last corrected sample) is one slice of a take-shaped tensor. Frames at the same
  step are stepped together by `sampling.unipc_step`: elementwise, with coefficients of the step alone.
  A frame's step, and so its solver order, follows from the row, so a checkpoint holds no per-frame
  counters.
- **The reference's quirk, kept.** Diffusers (and SkyReels' own code) hand each frame's scheduler a
  view of the latents, which it keeps as its last sample; the write of the frame's first step overwrites
  it, so the frame's second step corrects from its first prediction, not from its corrected sample.
  vidgen does the same on purpose, so a take equals the reference's (a plain UniPC differs by up to
  0.11 on the tiny test model at 4 steps).
- **The shared frames.** With `addnoise_condition` a, the next window sees them noised to level a
  (x (1 - a/1000) + noise a/1000, timestep a). This is the model's input only, never the take. The
  noise is drawn from a generator seeded by (seed, window, row), so a resumed take draws it again
  bit for bit; diffusers draws it from torch's global generator.

The sampler state (`sampling.SamplerState`, forcing=True) counts the take's rows as its steps. Its
latents are the whole take: finished frames, the current window, and zeros after it. Its history
holds the take-shaped x0s and corrected samples. `resume` saves and checks it like any other state.

Refusals (`problems`): a setting of a model without diffusion forcing; a take longer than the window
without overlap_history; an overlap that leaves a window nothing new; a causal block that does not divide
each window's latent frames. Diffusers leaves those frames noisy without a word, and trims such a
prefix with only a log warning.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import torch

from .errors import ConfigError
from .sampling import SamplerState, Schedule, StepReport, unipc_step

DEFAULT_FPS_INDEX = {16: 0}
"""The fps embedding's index: SkyReels-V2 was trained at two frame rates, 16 fps (0) and 24 fps (any
other value is 1, as diffusers maps it)."""

WindowFn = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]  # (frames, per-frame t int64 [F], row)


@dataclass(frozen=True)
class Window:
    start: int      # its first latent frame in the take
    frames: int     # latent frames it holds (the prefix included)
    prefix: int     # latent frames it starts on from the take so far (kept, not denoised)


@dataclass(frozen=True)
class Layout:
    """A diffusion-forcing take: its windows and their timestep matrices, all from the config alone."""

    total: int          # latent frames of the take
    base: int           # latent frames of one window
    overlap: int        # latent frames a window starts on from the one before
    block: int          # causal block size (latent frames)
    ar_step: int
    addnoise: float
    fps_index: int
    timesteps: tuple[int, ...]      # the schedule's, which every frame walks
    solver: str

    @property
    def long(self) -> bool:
        """Whether the take is made in several windows (diffusers' is_long_video)."""
        return self.overlap > 0 and self.total > self.base

    @cached_property
    def windows(self) -> tuple[Window, ...]:
        if not self.long:
            return (Window(0, self.total, 0),)
        count = 1 + (self.total - self.base - 1) // (self.base - self.overlap) + 1
        out = [Window(0, self.base, 0)]
        for w in range(1, count):
            finished = w * (self.base - self.overlap) + self.overlap
            out.append(Window(finished - self.overlap, min(self.total - finished + self.overlap, self.base),
                              self.overlap))
        return tuple(out)

    def matrix(self, w: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list]:
        """(timesteps [R, F], step index [R, F], update mask [R, F], (start, end) of each row) of window w:
        diffusers' own generate_timestep_matrix (it reads nothing of the pipeline it is a method of)."""
        from diffusers import SkyReelsV2DiffusionForcingPipeline

        win = self.windows[w]
        return SkyReelsV2DiffusionForcingPipeline.generate_timestep_matrix(
            None, win.frames, torch.tensor(self.timesteps), win.frames, self.ar_step, win.prefix, self.block)

    @cached_property
    def rows(self) -> tuple[int, ...]:
        """Model calls (rows) of each window."""
        return tuple(len(self.matrix(w)[0]) for w in range(len(self.windows)))

    @property
    def steps(self) -> int:
        """Model calls of the whole take (what progress and checkpoint_every count)."""
        return sum(self.rows)

    def digest(self, sched: Schedule) -> str:
        """The schedule's digest with the layout's: a checkpoint continues only the same take."""
        blob = json.dumps([sched.digest, self.total, self.base, self.overlap, self.block, self.ar_step,
                           self.addnoise, self.fps_index])
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def locate(self, step: int) -> tuple[int, int]:
        """(window, row in it) of the take's model call `step`."""
        for w, n in enumerate(self.rows):
            if step < n:
                return w, step
            step -= n
        return len(self.rows), 0


def window_frames(cfg, info) -> int:
    """The frames one window of `cfg`'s take renders: forcing.base_num_frames, else the model's clip length."""
    return cfg.forcing.base_num_frames or info.family.window(str(cfg.model.path or cfg.model.transformer or ""))


def layout(cfg, info, timesteps) -> tuple[Layout | None, list[str]]:
    """(the take's Layout over the schedule's `timesteps`, or None for a model without diffusion forcing;
    the problems of cfg.forcing). Only len(timesteps) decides the rows (the memory plan passes a range)."""
    f, default = cfg.forcing, type(cfg.forcing)()
    if not info.family.forcing:
        set_ = [k for k in vars(default) if getattr(f, k) != getattr(default, k)]
        forcing = ", ".join(fam for fam in _forcing_families())
        return None, [f"forcing.{k}: is set, but {info.variant} is no diffusion-forcing model; remove it or use "
                      f"{forcing}" for k in set_]
    t = info.vae_scale_temporal
    latent = lambda frames: (frames - 1) // t + 1                                            # noqa: E731
    window = window_frames(cfg, info)
    total, base = latent(cfg.num_frames), latent(window)
    overlap = latent(f.overlap_history) if f.overlap_history else 0
    block = f.causal_block_size or int(info.config("transformer").get("num_frame_per_block", 1))
    problems = []
    if cfg.num_frames > window and not f.overlap_history:
        problems.append(f"forcing.overlap_history: num_frames {cfg.num_frames} is longer than the model's window of "
                        f"{window} frames; set overlap_history (17 or 37) to render the take in windows")
    if overlap and cfg.num_frames > window and overlap >= base:
        problems.append(f"forcing.overlap_history: {f.overlap_history} frames ({overlap} latent) leave a window of "
                        f"{window} frames ({base} latent) nothing new; use fewer")
    if cfg.sampling.solver not in SOLVERS:
        problems.append(f"sampling.solver: {cfg.sampling.solver} is not run per frame; use unipc or euler")
    if cfg.speed.step_cache != "none":
        problems.append("speed.step_cache: skips whole-model steps, but each row of a diffusion-forcing take holds "
                        "frames at different steps; use step_cache: none")
    if cfg.video2video.video:
        problems.append(f"video2video: {info.variant} starts each window on its own noise; restyle with a Wan T2V model")
    lay = Layout(total, base, overlap if total > base else 0, block, f.ar_step, float(f.addnoise_condition),
                 DEFAULT_FPS_INDEX.get(cfg.fps, 1), tuple(int(x) for x in timesteps), cfg.sampling.solver)
    if not problems:
        bad = sorted({w.frames for w in lay.windows if w.frames % block} | ({lay.overlap} if lay.overlap % block else set()))
        if bad:
            problems.append(f"forcing.causal_block_size: {block} latent frames do not divide {bad} (the windows' "
                            f"{'and the overlap’s ' if lay.overlap % block else ''}latent frames); choose a divisor, "
                            f"or frames with num_frames, base_num_frames and overlap_history")
    return lay, problems


SOLVERS = ("unipc", "euler")


def _forcing_families() -> list[str]:
    from .families import FAMILIES

    return [f.name for f in FAMILIES.values() if f.forcing]


def window_noise(seed: int, lay: Layout, w: int, shape: tuple[int, ...]) -> torch.Tensor:
    """Window w's starting noise [B, C, F, H, W] (float32, CPU): the seed's generator drawn once a window,
    in order, as diffusers draws it from the generator it is given (a resumed take draws it again)."""
    gen = torch.Generator().manual_seed(seed)
    for v in range(w + 1):
        noise = torch.randn((*shape[:2], lay.windows[v].frames, *shape[3:]), generator=gen, dtype=torch.float32)
    return noise


def condition_noise(like: torch.Tensor, seed: int, w: int, row: int) -> torch.Tensor:
    """The noise that shows the shared frames at addnoise_condition (a generator of seed, window and row)."""
    gen = torch.Generator().manual_seed((seed * 1_000_003 + w * 10_007 + row) % 2**63)
    return torch.randn(like.shape, generator=gen, dtype=torch.float32).to(like.device, like.dtype)


class Take:
    """A take being sampled: the whole take's latents and per-frame history, and the current window."""

    def __init__(self, lay: Layout, sched: Schedule, seed: int, shape: tuple[int, ...], device: torch.device,
                 dtype: torch.dtype, state: SamplerState | None):
        self.lay, self.sched, self.seed, self.shape, self.device, self.dtype = lay, sched, seed, shape, device, dtype
        zeros = lambda: torch.zeros(shape, dtype=torch.float32, device=device)   # noqa: E731
        if state is None:
            self.take, self.hist, step = zeros(), {k: zeros() for k in ("x0_prev", "x0_prev2", "last_sample")}, 0
        else:
            self.take = state.latents.to(device)
            self.hist = {k: state.history[k].to(device) if k in state.history else zeros()
                         for k in ("x0_prev", "x0_prev2", "last_sample")}
            step = state.step
        self.step = step
        self.w, self.row = lay.locate(step)
        self.window = None
        if self.w < len(lay.windows):
            self._open(fresh=state is None or self.row == 0)

    def _open(self, fresh: bool) -> None:
        """Window self.w's latents: its noise (fresh) or the checkpoint's, its prefix from the take."""
        win = self.lay.windows[self.w]
        span = slice(win.start, win.start + win.frames)
        if fresh:
            self.window = window_noise(self.seed, self.lay, self.w, self.shape).to(self.device)
            for h in self.hist.values():
                h.zero_()
        else:
            self.window = self.take[:, :, span].clone()
        if win.prefix:     # diffusers writes the prefix in the transformer's dtype into the float32 latents
            self.window[:, :, :win.prefix] = self.take[:, :, win.start:win.start + win.prefix].to(self.dtype)
        self.matrix = self.lay.matrix(self.w)

    def state(self) -> SamplerState:
        """The take now: finished frames, the window's frames after its prefix, the history."""
        latents = self.take.clone()
        if self.window is not None:
            win = self.lay.windows[self.w]
            latents[:, :, win.start + win.prefix:win.start + win.frames] = self.window[:, :, win.prefix:]
        s = self.sched
        return SamplerState(step=self.step, latents=latents, history={k: v.clone() for k, v in self.hist.items()},
                            solver=s.solver, steps=self.lay.steps, shift=s.shift, schedule=s.schedule,
                            schedule_digest=self.lay.digest(s), forcing=True)

    def denoised(self) -> torch.Tensor:
        """The take's latents with each stepped frame of the window at its newest x0 (for previews)."""
        out = self.state().latents
        if self.window is not None:
            win = self.lay.windows[self.w]
            span = slice(win.start + win.prefix, win.start + win.frames)
            stepped = self.hist["x0_prev"][:, :, span].flatten(3).abs().sum((0, 1, 3)) > 0
            out[:, :, span][:, :, stepped] = self.hist["x0_prev"][:, :, span][:, :, stepped]
        return out

    def run_row(self, fn: WindowFn) -> torch.Tensor:
        """One model call of the window and the steps of its frames due; returns the row's largest timestep."""
        lay, win, r = self.lay, self.lay.windows[self.w], self.row
        t_rows, index, update, intervals = self.matrix
        a, b = intervals[r]
        x = self.window[:, :, a:b].to(self.dtype).clone()
        t = t_rows[r, a:b].clone()
        if lay.addnoise > 0 and a < win.prefix:           # the shared frames, shown to the model at a noise level
            k = lay.addnoise * 0.001
            cond = x[:, :, a:win.prefix]
            x[:, :, a:win.prefix] = cond * (1.0 - k) + condition_noise(cond, self.seed, self.w, r) * k
            t[: win.prefix - a] = int(lay.addnoise)
        v = fn(x, t.to(self.device), self.step)
        due = [f for f in range(a, b) if bool(update[r, f])]
        n = len(self.sched.timesteps)
        for k in sorted({int(index[r, f]) - 1 for f in due}):           # the frames at step k, stepped together
            frames = torch.tensor([f for f in due if int(index[r, f]) - 1 == k], device=self.device)
            self._step_frames(frames, v[:, :, frames - a], k, n)
        self.step, self.row = self.step + 1, self.row + 1
        top = int(t_rows[r, a:b].max())
        if self.row == len(t_rows):            # the window is done: its new frames join the take
            self.take[:, :, win.start + win.prefix:win.start + win.frames] = self.window[:, :, win.prefix:]
            self.w, self.row, self.window = self.w + 1, 0, None
            if self.w < len(lay.windows):
                self._open(fresh=True)
        return torch.tensor(top)

    def _step_frames(self, frames: torch.Tensor, v: torch.Tensor, k: int, n: int) -> None:
        win = self.lay.windows[self.w]
        take_idx = frames + win.start
        x = self.window[:, :, frames]
        sig = self.sched.sigmas
        if self.lay.solver == "euler":
            m0, x_next = x - sig[k] * v, x + (sig[k + 1] - sig[k]) * v
            corrected = x
        else:
            h = self.hist
            m1 = h["x0_prev"][:, :, take_idx] if k >= 1 else None
            m2 = h["x0_prev2"][:, :, take_idx] if k >= 2 else None
            # A frame's second step corrects from the frame's latents as they are now (its first step's
            # prediction), as diffusers' and SkyReels' own loops do: their schedulers keep a view of the
            # latents as the last sample, which the write after the first step overwrites.
            last = x if k == 1 else h["last_sample"][:, :, take_idx] if k >= 2 else None
            order_prev = min(2, n - k + 1, k) if k >= 1 else 0
            x_next, m0, corrected, _ = unipc_step(sig, k, n, x, v, m1, m2, last, min(k, 2), order_prev)
            if m1 is not None:
                h["x0_prev2"][:, :, take_idx] = m1
        self.hist["x0_prev"][:, :, take_idx] = m0.float()
        self.hist["last_sample"][:, :, take_idx] = corrected.float()
        self.window[:, :, frames] = x_next


def check_state(state: SamplerState, lay: Layout, sched: Schedule) -> None:
    """ConfigError unless `state` was saved by this take (the same schedule, windows and matrix)."""
    problems = [f"{name}: the saved state has {got!r}, this render {want!r}" for name, got, want in [
        ("solver", state.solver, sched.solver), ("steps", state.steps, lay.steps), ("shift", state.shift, sched.shift),
        ("schedule", state.schedule, sched.schedule), ("forcing", state.forcing, True)] if got != want]
    if not problems and state.schedule_digest != lay.digest(sched):
        problems.append("forcing: the saved state was made with other windows, causal blocks or schedule")
    if not 0 <= state.step <= lay.steps:
        problems.append(f"step: {state.step} is outside 0..{lay.steps}")
    if problems:
        raise ConfigError(problems, source="sampler state")


@torch.no_grad()
def sample_take(fn: WindowFn, lay: Layout, sched: Schedule, seed: int, shape: tuple[int, ...], *,
                device: torch.device, dtype: torch.dtype, callback: Callable[[StepReport], None] | None = None,
                state: SamplerState | None = None) -> torch.Tensor:
    """Sample a diffusion-forcing take of latent shape `shape` [B, C, T, H, W]; returns its latents.

    fn(frames [B, C, F, H, W] in `dtype`, per-frame timesteps int64 [F], model call index) -> the guided
    velocity of those frames. `callback` gets a StepReport after every row (steps: the take's rows);
    `state`: a checkpoint of this take to continue from (check_state first).
    """
    take = Take(lay, sched, seed, shape, device, dtype, state)
    while take.w < len(lay.windows):
        t = take.run_row(fn)
        if callback is not None:
            callback(StepReport(take.step, lay.steps, t, take.state(), take.denoised()))
    return take.take
