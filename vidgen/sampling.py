"""Flow-matching solvers that follow Wan2.2's own schedulers step for step.

Three solvers, each a small loop over a schedule given as plain tensors (timesteps, sigmas):

- ``unipc``: UniPC order 2, B(h) = expm1 (bh2), predict-x0, lower-order final step, final sigma 0
  (Wan2.2 ``wan/utils/fm_solvers_unipc.py`` FlowUniPCMultistepScheduler; UniPC: Zhao et al. 2023).
- ``dpmpp``: DPM-Solver++(2M), midpoint, first-order first and last step (Wan2.2
  ``wan/utils/fm_solvers.py`` FlowDPMSolverMultistepScheduler as ``wan/text2video.py`` builds it for
  ``sample_solver='dpm++'``; Lu et al. 2022).
- ``euler``: x_{i+1} = x_i + (sigma_{i+1} - sigma_i) * v.

The schedule is built once (`schedule` -> a `Schedule`: solver, timesteps, sigmas) and passed to
`sample`, k-diffusion style. How the model is called: ``velocity_fn(x, t, i)`` gets the current
latents, ``t``, the integer timestep as an int64 tensor of shape [1] on the latents' device --
exactly ``torch.stack([t])``, what Wan's generate loop passes to its model (expand it to the batch if
needed) -- and ``i``, the index of the step in the schedule (``t == schedule.timesteps[i]``), so a
step cache never has to count calls. It returns the flow velocity (what Wan's model predicts, after
guidance). The two-expert switch of Wan2.2 A14B belongs in velocity_fn (vidgen.denoiser).

Numerics follow Wan, not textbook formulas: the sigmas are float32, so every step coefficient is a
float32 scalar (computed on the CPU, like Wan) that then multiplies latents of any dtype; DPM++ casts the
latents to float32 inside each step, as Wan does. On CPU the trajectories equal Wan's bit for bit, for
float32 and float64 latents alike (float64 coefficients would move a 40-step trajectory by ~1e-7).
One deliberate difference: Wan finds its first step by looking the first timestep up in the list, so
when the first two timesteps are equal (unipc, shift 12 with >= 92 steps, shift 5 with >= 251) it
skips sigma_0 and fails on its last step; here the first step is always step 0.

Schedules (`schedule`'s `schedule` argument, the config's sampling.schedule):
- "wan": Wan's grids. unipc / euler: sigma = linspace(float32(0.999), 0, steps + 1)[:-1] (float64),
  shifted s*sigma / (1 + (s-1)*sigma), t = int(sigma * 1000) (truncated), sigma stored as float32 with a
  final 0. dpmpp: the same with linspace(1, 0, steps + 1)[:steps] (so its first timestep is 1000).
- "diffusers": the grid of diffusers' ``UniPCMultistepScheduler(prediction_type="flow_prediction",
  use_flow_sigmas=True, flow_shift=shift)``; pass the model folder's ``scheduler/scheduler_config.json``
  as ``scheduler_config`` (dict) to reproduce diffusers' WanPipeline: ``sample(fn, x, schedule("unipc",
  steps, None, "diffusers", scheduler_config=cfg))`` steps exactly like it (shift=None keeps the
  folder's flow_shift). The grid is built by diffusers itself; our loops do the stepping.

Progress: the ``callback(report)`` of `sample` gets a `StepReport` after every step, k-diffusion style:
the steps done, ``t``, the `SamplerState` and ``denoised``, that step's estimate of the clean latents.
Resuming: ``report.state.to_tensors()`` gives (tensors, meta) for ``safetensors.torch.save_file(tensors, path,
metadata={"sampler": json.dumps(meta)})``, and ``sample(fn, None, sched, state=SamplerState.from_tensors(
tensors, meta))`` continues bit-identically.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

import numpy as np
import torch

from vidgen import records as R
from vidgen.config import SCHEDULES, SOLVERS
from vidgen.errors import ConfigError

VelocityFn = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]    # (x, t int64 [1], step index)
StepCallback = Callable[["StepReport"], None]
# The per-solver loops report (step index, total, t, latents after the step, history after the step,
# the step's x0 = x - sigma_i v).
LoopCallback = Callable[[int, int, torch.Tensor, torch.Tensor, dict, torch.Tensor], None]

NUM_TRAIN_TIMESTEPS = 1000          # every Wan2.1 / Wan2.2 config

# Scheduler settings our UniPC loop implements; a diffusers scheduler_config must agree on each.
_DIFFUSERS_UNIPC_REQUIRED = {
    "prediction_type": "flow_prediction", "use_flow_sigmas": True, "predict_x0": True, "solver_order": 2,
    "solver_type": "bh2", "lower_order_final": True, "thresholding": False, "final_sigmas_type": "zero",
    "use_dynamic_shifting": False, "solver_p": None, "disable_corrector": [],
}


# ---------------------------------------------------------------------------------------------- schedules

@dataclass(frozen=True)
class Schedule:
    """The grid a solver walks, built once by `schedule` and passed to `sample`."""

    solver: str                 # "unipc" | "dpmpp" | "euler"
    steps: int
    shift: float | None         # None: the diffusers scheduler_config's flow_shift
    schedule: str               # "wan" | "diffusers" (sampling.schedule)
    timesteps: torch.Tensor     # int64 [steps], what the model sees
    sigmas: torch.Tensor        # float32 [steps + 1], ending with 0.0
    digest: str                 # schedule_digest(timesteps, sigmas): a saved state resumes only on this grid


def schedule(solver: str, steps: int, shift: float | None, schedule: str = "wan", *,
             scheduler_config: dict[str, Any] | None = None) -> Schedule:
    """The timesteps and sigmas a solver walks.

    Args:
        solver: "unipc" | "dpmpp" | "euler".
        steps: number of model evaluations (>= 1).
        shift: flow shift. schedule="diffusers" only: None keeps scheduler_config's flow_shift.
        schedule: "wan" (Wan's own grids) or "diffusers" (diffusers' flow UniPC grid, for every solver).
        scheduler_config: schedule="diffusers" only: a UniPCMultistepScheduler config (the model
            folder's scheduler_config.json); None = diffusers' defaults with flow sigmas.
    """
    grid = schedule
    problems = _check_args(solver, steps, shift, grid)
    if grid == "diffusers":
        problems += _check_diffusers_config(scheduler_config or {})
    elif scheduler_config is not None:
        problems.append("scheduler_config: only used with schedule='diffusers'")
    if problems:
        raise ConfigError(problems)
    if grid == "diffusers":
        timesteps, sigmas = _diffusers_grid(steps, shift, scheduler_config or {})
    else:
        if solver == "dpmpp":
            base = np.linspace(1.0, 0.0, steps + 1)[:steps]
        else:
            # Wan builds its scheduler with shift=1, whose largest training sigma is float32(1 - 1/1000).
            sigma_max = float(np.float32(1.0 - 1.0 / NUM_TRAIN_TIMESTEPS))
            base = np.linspace(sigma_max, 0.0, steps + 1)[:-1]
        timesteps, sigmas = _shifted_grid(base, shift)
    return Schedule(solver, steps, shift, grid, timesteps, sigmas, schedule_digest(timesteps, sigmas))


def restyle_schedule(sched: Schedule, steps: int) -> Schedule:
    """The last `steps` steps of `sched` (video-to-video: the source noised to their first sigma), a grid
    of its own (its digest: a saved state resumes only on it)."""
    t, s = sched.timesteps[-steps:], sched.sigmas[-steps - 1:]
    return replace(sched, steps=steps, timesteps=t, sigmas=s, digest=schedule_digest(t, s))


def flow_shift(sigma, shift: float):
    """The flow shift of SD3 / Wan, sigma -> shift sigma / (1 + (shift - 1) sigma); arrays or tensors."""
    return shift * sigma / (1 + (shift - 1) * sigma)


def _shifted_grid(base: np.ndarray, shift: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Flow shift (SD3 / Wan) in float64, timesteps truncated, sigmas float32 with a final 0."""
    sigmas = flow_shift(base, shift)
    timesteps = torch.from_numpy(sigmas * NUM_TRAIN_TIMESTEPS).to(torch.int64)
    return timesteps, torch.from_numpy(np.concatenate([sigmas, [0.0]]).astype(np.float32))


def _diffusers_grid(steps: int, shift: float | None, config: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    from diffusers import UniPCMultistepScheduler

    base = {"prediction_type": "flow_prediction", "use_flow_sigmas": True}
    base.update(config)
    if shift is not None:
        base["flow_shift"] = shift
    scheduler = UniPCMultistepScheduler.from_config(base)
    scheduler.set_timesteps(steps, device="cpu")
    return scheduler.timesteps.to(torch.int64).clone(), scheduler.sigmas.to(torch.float32).clone()


def _check_args(solver: str, steps: int, shift: float | None, grid: str) -> list[str]:
    problems = []
    if solver not in SOLVERS:
        problems.append(f"solver: {solver!r} is not one of {', '.join(SOLVERS)}")
    if grid not in SCHEDULES:
        problems.append(f"schedule: {grid!r} is not one of {', '.join(SCHEDULES)}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        problems.append(f"steps: {steps!r} must be an integer >= 1")
    if shift is None and grid != "diffusers":
        problems.append("shift: None is only allowed with schedule='diffusers' (keeps the folder's flow_shift)")
    elif shift is not None and not shift > 0:
        problems.append(f"shift: {shift!r} must be > 0")
    return problems


def _check_diffusers_config(config: dict[str, Any]) -> list[str]:
    problems = []
    name = config.get("_class_name", "UniPCMultistepScheduler")
    if name != "UniPCMultistepScheduler":
        problems.append(f"scheduler_config._class_name: {name!r}; schedule='diffusers' needs UniPCMultistepScheduler")
    for key, want in _DIFFUSERS_UNIPC_REQUIRED.items():
        if key in config and config[key] != want:
            problems.append(f"scheduler_config.{key}: {config[key]!r} is not supported; use {want!r}")
    return problems


def schedule_digest(timesteps: torch.Tensor, sigmas: torch.Tensor) -> str:
    """A short hash of a schedule, so a saved state is never resumed on another grid."""
    h = hashlib.sha256(timesteps.to(torch.int64).numpy().tobytes())
    h.update(sigmas.to(torch.float32).numpy().tobytes())
    return h.hexdigest()[:16]


# ------------------------------------------------------------------------------------------------- state

@dataclass
class SamplerState:
    """Everything needed to continue a render after `step` of `steps` steps, bit-identically."""

    step: int                          # index of the next step to run
    latents: torch.Tensor              # [B, C, F, H, W], the input of step `step`
    history: dict[str, torch.Tensor | int] = field(default_factory=dict)   # the solver's multistep memory
    solver: str = "unipc"
    steps: int = 0
    shift: Optional[float] = None
    schedule: str = "wan"              # sampling.schedule ("wan" | "diffusers")
    schedule_digest: str = ""
    forcing: bool = False              # a diffusion-forcing take (vidgen.forcing): step counts its rows
    segments: tuple = ()               # an Animate render (vidgen.animate): the finished segments' latents, this
                                       # state being inside segment len(segments)

    def to_tensors(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """(flat tensors for safetensors, JSON-able meta)."""
        tensors = {"latents": self.latents.detach().contiguous()}
        ints = {}
        for key, value in self.history.items():
            if isinstance(value, torch.Tensor):
                tensors[f"history.{key}"] = value.detach().contiguous()
            else:
                ints[key] = int(value)
        meta = {"step": self.step, "solver": self.solver, "steps": self.steps, "shift": self.shift,
                "schedule": self.schedule, "schedule_digest": self.schedule_digest, "history": ints}
        if self.forcing:
            meta["forcing"] = True
        if self.segments:
            tensors.update({f"segment.{k}": x.detach().contiguous() for k, x in enumerate(self.segments)})
            meta["segments"] = len(self.segments)
        return tensors, meta

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], meta: dict[str, Any] | str,
                     device: torch.device | str | None = None, *, source: str = "sampler state",
                     fix: str = "save the state again with SamplerState.to_tensors") -> "SamplerState":
        """Inverse of `to_tensors` (meta may be the JSON string); tensors moved to `device` if given.

        Everything is checked first: InputError "{source} is damaged: ...; {fix}" lists what is
        missing or of the wrong type, shape or dtype (`source` names the file, e.g. "checkpoint 'x'").
        """
        problems = _state_problems(tensors, meta)
        if problems:
            raise R.damaged(source, problems, fix)
        if isinstance(meta, str):
            meta = json.loads(meta)
        meta = {**meta, "schedule": meta.get("schedule", meta.get("kind"))}
        move = (lambda x: x.to(device)) if device is not None else (lambda x: x)
        history: dict[str, torch.Tensor | int] = dict(meta.get("history", {}))
        for key, value in tensors.items():
            if key.startswith("history."):
                history[key[len("history."):]] = move(value)
        segments = tuple(move(tensors[f"segment.{k}"]) for k in range(int(meta.get("segments", 0))))
        return cls(step=meta["step"], latents=move(tensors["latents"]), history=history,
                   solver=meta["solver"], steps=meta["steps"], shift=meta["shift"], schedule=meta["schedule"],
                   schedule_digest=meta.get("schedule_digest", ""), forcing=meta.get("forcing") is True,
                   segments=segments)


@dataclass(frozen=True)
class StepReport:
    """What `sample` reports after each step (k-diffusion's callback dict, as one record)."""

    step: int                          # steps done (the step just taken is step - 1)
    total: int                         # steps in the schedule
    t: torch.Tensor                    # 0-d int64, the timestep of the step just taken
    state: SamplerState                # everything needed to continue from here
    denoised: torch.Tensor = field(repr=False)   # float32 [B, C, F, H, W]: x0 = x - sigma v of the step's model call


# The multistep memory each solver's loop writes after every step (see the loops' `history`), so a
# state past step 0 without it cannot continue.
_HISTORY = {"unipc": ("x0_prev", "last_sample", "lower_order_nums", "this_order"),
            "dpmpp": ("x0_prev", "lower_order_nums"), "euler": ()}


def _state_problems(tensors: dict[str, torch.Tensor], meta: dict[str, Any] | str) -> list[str]:
    """What keeps `tensors` + `meta` from being a state `to_tensors` wrote (nothing is trusted)."""
    problems: list[str] = []
    if isinstance(meta, str):
        meta = R.parse_json_object(meta, "its state", problems)
        if meta is None:
            return problems
    if "schedule" not in meta and "kind" in meta:      # states of earlier versions name the grid "kind"
        meta = {**meta, "schedule": meta["kind"]}
    where = "state"
    steps = R.int_field(meta, "steps", R.REQUIRED, 1, None, where, problems)
    step = R.int_field(meta, "step", R.REQUIRED, 0, steps, where, problems)
    solver = R.choice_field(meta, "solver", R.REQUIRED, SOLVERS, where, problems)
    R.choice_field(meta, "schedule", R.REQUIRED, SCHEDULES, where, problems)
    if "shift" not in meta:
        problems.append("state: shift is missing")
    else:
        R.float_field(meta, "shift", None, where, problems, above=0.0)
    R.str_field(meta, "schedule_digest", "", where, problems)
    ints = meta.get("history", {})
    if not isinstance(ints, dict) or not all(isinstance(k, str) and R.is_int(v) and 0 <= v <= 2
                                             for k, v in ints.items()):
        problems.append(f"state: history is {R.describe(ints)} (expected an object of small integers)")
        ints = {}

    latents = tensors.get("latents")
    if not isinstance(latents, torch.Tensor):
        problems.append("it has no 'latents' tensor")
    elif latents.dim() != 5 or not latents.is_floating_point():
        problems.append(f"its latents are a {latents.dim()}-d {str(latents.dtype).removeprefix('torch.')} tensor, "
                        f"not 5-d [B, C, F, H, W] floating point")
        latents = None
    segments = meta.get("segments", 0)
    if not (R.is_int(segments) and 0 <= segments <= 10_000):
        problems.append(f"state: segments is {R.describe(segments)} (expected a count of finished Animate segments)")
        segments = 0
    problems += [f"it lacks tensor segment.{k} (a finished Animate segment's latents)" for k in range(segments)
                 if f"segment.{k}" not in tensors]
    for key, value in tensors.items():
        name = R.safe_name(key, "(a long name)")
        if key == "latents":
            continue
        index = key.removeprefix("segment.")
        if key.startswith("segment.") and index.isdigit() and int(index) < segments:
            if latents is not None and (value.shape != latents.shape or not value.is_floating_point()):
                problems.append(f"tensor {name} has shape {list(value.shape)} (expected the latents' shape "
                                f"{list(latents.shape)}, floating point)")
            continue
        if not key.startswith("history."):
            problems.append(f"tensor {name} is not part of a sampler state")
        elif latents is not None and (value.shape != latents.shape or not value.is_floating_point()):
            problems.append(f"tensor {name} has shape {list(value.shape)} and dtype "
                            f"{str(value.dtype).removeprefix('torch.')} (expected the latents' shape "
                            f"{list(latents.shape)}, floating point)")
    if isinstance(step, int) and step > 0 and solver in _HISTORY:
        have = set(ints) | {k.removeprefix("history.") for k in tensors if k.startswith("history.")}
        # a diffusion-forcing take: each frame's step (so its order) follows from the row; its x0s are kept
        need = _HISTORY[solver][:2] if meta.get("forcing") is True and solver == "unipc" else _HISTORY[solver]
        if lacking := [k for k in need if k not in have]:
            problems.append(f"its {solver} history lacks {', '.join(lacking)} (needed to continue after step {step})")
    return problems


# ------------------------------------------------------------------------------------------ entry point

@torch.no_grad()
def sample(velocity_fn: VelocityFn, latents: torch.Tensor | None, sched: Schedule, *,
           callback: StepCallback | None = None, state: SamplerState | None = None) -> torch.Tensor:
    """Integrate the flow from noise to clean latents with Wan's numerics.

    Args:
        velocity_fn: (x [B, C, F, H, W], t int64 [1], step index i) -> velocity like x.
        latents: starting noise [B, C, F, H, W]; ignored (may be None) when `state` is given.
        sched: the grid to walk (`schedule(...)`), built once by the caller.
        callback: called after each step with its StepReport (steps done, total, t, the SamplerState
            after it, the denoised estimate).
        state: a saved SamplerState to continue from; it must come from the same solver and schedule.

    Returns:
        The denoised latents [B, C, F, H, W].
    """
    start, history = 0, {}
    if state is not None:
        check_state(state, sched)
        latents, start, history = state.latents, state.step, state.history
    if latents is None:
        raise ConfigError("latents: None needs a `state` to resume from")

    on_step = None
    if callback is not None:
        def on_step(i, total, t, x, hist, x0):
            state = SamplerState(step=i + 1, latents=x, history=hist, solver=sched.solver, steps=sched.steps,
                                 shift=sched.shift, schedule=sched.schedule, schedule_digest=sched.digest)
            callback(StepReport(i + 1, total, t, state, x0.float()))
    return _LOOPS[sched.solver](velocity_fn, latents, sched.timesteps, sched.sigmas, start=start, history=history,
                                callback=on_step)


def check_state(state: SamplerState, sched: Schedule) -> None:
    """ConfigError unless `state` was saved on `sched` (same solver, steps, shift and grid)."""
    problems = [f"{name}: the saved state has {got!r}, this render {want!r}"
                for name, got, want in [("solver", state.solver, sched.solver), ("steps", state.steps, sched.steps),
                                        ("shift", state.shift, sched.shift),
                                        ("schedule", state.schedule, sched.schedule)]
                if got != want]
    if not problems and state.schedule_digest != sched.digest:
        problems.append("schedule: the saved state was made on a different sigma grid (scheduler config)")
    if not 0 <= state.step <= sched.steps:
        problems.append(f"step: {state.step} is outside 0..{sched.steps}")
    if problems:
        raise ConfigError(problems, source="sampler state")


# ------------------------------------------------------------------------------------------- the loops

def _log_snr(sigma: torch.Tensor) -> torch.Tensor:
    """lambda = log(alpha) - log(sigma) with alpha = 1 - sigma (flow matching); float32 like Wan."""
    return torch.log(1 - sigma) - torch.log(sigma)


def _model_t(timesteps: torch.Tensor, i: int, device: torch.device) -> torch.Tensor:
    return timesteps[i:i + 1].to(device)              # int64 [1]: Wan's torch.stack([t])


@torch.no_grad()
def sample_unipc(velocity_fn: VelocityFn, x: torch.Tensor, timesteps: torch.Tensor, sigmas: torch.Tensor, *,
                 start: int = 0, history: dict | None = None, callback: LoopCallback | None = None) -> torch.Tensor:
    """Flow UniPC-2 (bh2, predict x0, lower-order final) as Wan's FlowUniPCMultistepScheduler steps it.

    Each step: x0 = x - sigma_i v; correct the previous prediction x with UniC (from step 1 on, using x0);
    predict the next x with UniP of order min(2, steps - i, steps taken + 1). The model sees the
    uncorrected prediction, the corrected one seeds the next predictor. At the last step the order is 1
    and sigma is 0, so the result is that step's x0 exactly (its correction has no effect).

    history (all optional): x0_prev, x0_prev2 (the last two x0), last_sample (the last corrected x),
    lower_order_nums, this_order (the order of the last predictor).
    """
    n = len(timesteps)
    h = history or {}
    m1, m2, last = h.get("x0_prev"), h.get("x0_prev2"), h.get("last_sample")
    lower, order_prev = int(h.get("lower_order_nums", 0)), int(h.get("this_order", 0))
    for i in range(start, n):
        v = velocity_fn(x, _model_t(timesteps, i, x.device), i)
        x_next, m0, last, order = unipc_step(sigmas, i, n, x, v, m1, m2, last, lower, order_prev)
        lower = min(lower + 1, 2)
        m1, m2, order_prev, x = m0, m1, order, x_next
        if callback is not None:
            hist = {"x0_prev": m1, "last_sample": last, "lower_order_nums": lower, "this_order": order_prev}
            if m2 is not None:
                hist["x0_prev2"] = m2
            callback(i, n, timesteps[i], x, hist, m1)
    return x


def unipc_step(sigmas: torch.Tensor, i: int, n: int, x: torch.Tensor, v: torch.Tensor, m1, m2, last, lower: int,
               order_prev: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Step i of n of sample_unipc from x with the model's velocity v, given the step's history (m1, m2:
    the last two x0; last: the last corrected sample; lower: lower_order_nums; order_prev: the last
    predictor's order). Returns (the next x, this step's x0, the corrected x, this predictor's order).
    Elementwise with scalar coefficients of i alone: the frames of a diffusion-forcing window that are
    at the same step are stepped together (vidgen.forcing)."""
    m0 = x - sigmas[i] * v                                        # x0 prediction at step i
    if i > 0 and last is not None:
        x = _unic(sigmas, i, last, m0, m1, m2, order_prev)
    order = min(2, n - i, lower + 1)
    return _unip(sigmas, i, x, m0, m1, order), m0, x, order


def _unip(sigmas, i, x, m0, m1, order):
    """UniP-B(h) predictor from sigma_i to sigma_{i+1}; for order 2, rho = 1/2 as in UniPC-2."""
    s_t, s_0 = sigmas[i + 1], sigmas[i]
    a_t = 1 - s_t
    h = _log_snr(s_t) - _log_snr(s_0)
    h_phi_1 = torch.expm1(-h)                                         # also B(h) for bh2
    x_t = s_t / s_0 * x - a_t * h_phi_1 * m0
    if order == 2:
        rk = (_log_snr(sigmas[i - 1]) - _log_snr(s_0)) / h
        d1 = (m1 - m0) / rk
        return (x_t - a_t * h_phi_1 * (0.5 * d1)).to(x.dtype)
    return x_t.to(x.dtype)


def _unic(sigmas, i, x_prev, m_t, m0, m1, order):
    """UniC-B(h) corrector: the sample at sigma_i, recomputed from x_prev at sigma_{i-1} with the new x0 m_t."""
    s_t, s_0 = sigmas[i], sigmas[i - 1]
    a_t = 1 - s_t
    h = _log_snr(s_t) - _log_snr(s_0)
    hh = -h
    h_phi_1 = torch.expm1(hh)
    b_h = h_phi_1                                                     # bh2: B(h) = e^{-h} - 1
    if order == 1:
        rhos = torch.tensor([0.5], dtype=x_prev.dtype)
        corr = 0
    else:
        # rho solves R rho = b with R = [[1, 1], [r, 1]], b_k = k! phi_{k+1}(hh) / B(h) (UniPC eq. B(h)).
        rk = (_log_snr(sigmas[i - 2]) - _log_snr(s_0)) / h
        h_phi_k = h_phi_1 / hh - 1
        b1 = h_phi_k * 1 / b_h
        h_phi_k = h_phi_k / hh - 1 / 2
        b2 = h_phi_k * 2 / b_h
        r = torch.stack([torch.ones(2), torch.stack([rk, torch.ones(())])])
        rhos = torch.linalg.solve(r, torch.stack([b1, b2])).to(x_prev.dtype)
        corr = rhos[0] * ((m1 - m0) / rk)
    x_t = s_t / s_0 * x_prev - a_t * h_phi_1 * m0
    x_t = x_t - a_t * b_h * (corr + rhos[-1] * (m_t - m0))
    return x_t.to(x_prev.dtype)


@torch.no_grad()
def sample_dpmpp(velocity_fn: VelocityFn, x: torch.Tensor, timesteps: torch.Tensor, sigmas: torch.Tensor, *,
                 start: int = 0, history: dict | None = None, callback: LoopCallback | None = None) -> torch.Tensor:
    """Flow DPM-Solver++(2M), midpoint, as Wan's FlowDPMSolverMultistepScheduler steps it.

    First order at the first step and at the last step (final sigma 0), second order between. The
    latents are cast to float32 inside each step and the result takes the x0 dtype (Wan does both).
    On Wan's dpm++ grid sigma_0 = 1, so lambda_0 = -inf and the second step's D1 term is exactly 0.

    history (all optional): x0_prev (the last x0), lower_order_nums.
    """
    n = len(timesteps)
    h = history or {}
    m1, lower = h.get("x0_prev"), int(h.get("lower_order_nums", 0))
    for i in range(start, n):
        v = velocity_fn(x, _model_t(timesteps, i, x.device), i)
        m0 = x - sigmas[i] * v
        xf = x.to(torch.float32)
        s_t, s_0 = sigmas[i + 1], sigmas[i]
        a_t = 1 - s_t
        h_step = _log_snr(s_t) - _log_snr(s_0)
        c = a_t * (torch.exp(-h_step) - 1.0)
        if lower < 1 or i == n - 1:
            x_next = (s_t / s_0) * xf - c * m0
        else:
            r0 = (_log_snr(s_0) - _log_snr(sigmas[i - 1])) / h_step
            d1 = (1.0 / r0) * (m0 - m1)
            x_next = (s_t / s_0) * xf - c * m0 - 0.5 * c * d1
        x = x_next.to(m0.dtype)
        m1, lower = m0, min(lower + 1, 2)
        if callback is not None:
            callback(i, n, timesteps[i], x, {"x0_prev": m1, "lower_order_nums": lower}, m0)
    return x


@torch.no_grad()
def sample_euler(velocity_fn: VelocityFn, x: torch.Tensor, timesteps: torch.Tensor, sigmas: torch.Tensor, *,
                 start: int = 0, history: dict | None = None, callback: LoopCallback | None = None) -> torch.Tensor:
    """Flow Euler: x_{i+1} = x_i + (sigma_{i+1} - sigma_i) v(x_i, t_i), the step size in float32."""
    n = len(timesteps)
    for i in range(start, n):
        v = velocity_fn(x, _model_t(timesteps, i, x.device), i)
        x0 = x - sigmas[i] * v if callback is not None else None     # reported only, not stepped with
        x = x + (sigmas[i + 1] - sigmas[i]) * v
        if callback is not None:
            callback(i, n, timesteps[i], x, {}, x0)
    return x


_LOOPS = {"unipc": sample_unipc, "dpmpp": sample_dpmpp, "euler": sample_euler}
