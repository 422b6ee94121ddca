"""The render pipeline: preflight -> load -> encode prompt -> denoise -> save latents -> decode -> write.

Numbered stages, one progress callback, one result dataclass. Everything that can be worked out
without weights is done first by `vidgen.preflight` (the memory plan too), which hands the stages one immutable Plan. `Renderer.render` is the one render path: `vidgen.render`, `Pipeline.generate` and
the queue's executor all go through it (resume, preflight, reuse of a warm pipeline).
"""

from __future__ import annotations

import logging
import resource
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import torch

from . import animate_render, lora, parallel, resume
from .conditioning import initial_latents
from .control import restyle_start
from .config import CODECS, RenderConfig, digest
from .denoiser import WanDenoiser, build_denoiser
from .errors import ConfigError, InputError
from .forcing import sample_take
from .deliver import decode_and_write
from .io import literal
from .loading import Components, load_components, load_vae
from .memory import plan_render, same_policy, wraps_weights
from .outofmemory import out_of_memory
from .parallel import writes
from .paths import OutputSet, ensure_folder
from .memo import Memo
from .preflight import Plan, Target, preflight, target
from .presets import load_config
from .preview import sampling_preview
from .prompt import encode_with
from .residency import Residency
from .resume import read_latents, save_latents
from .sampling import SamplerState, StepReport, sample
from .speed import apply_speed

log = logging.getLogger("vidgen")


@dataclass
class Progress:
    """One progress report: `stage` is encode | denoise | decode; `step` of `total` done. `preview`,
    when set, gives the render so far as a small uint8 RGB image (computed only when called)."""

    stage: str
    step: int
    total: int
    preview: Callable[[], Any] | None = field(default=None, repr=False, compare=False)


ProgressCallback = Callable[[Progress], None]


@dataclass
class RenderResult:
    path: Path                      # the finished video (or PNG frame folder)
    latents_path: Path | None       # sampled latents (None if output.save_latents is false)
    num_frames: int                 # frames written (delivered: output.fps retimes them)
    fps: int                        # the written file's rate (output.fps, else fps)
    width: int
    height: int
    seed: int
    config_digest: str
    timings: dict[str, float] = field(default_factory=dict)   # seconds per stage
    peak_memory_bytes: int = 0      # CUDA: max allocated during the render; CPU: process peak RSS
    peak_memory_kind: str = "cpu-rss"
    guard: dict | None = None       # the guard's report (scores per check) when it ran


# --------------------------------------------------------------------------------------------
# Stages


def _outputs(plan: Plan, movable: bool = True) -> OutputSet:
    """The files this render writes, claimed and moved as one (vidgen.paths.OutputSet); `movable`:
    the files of its own already there (a resumed checkpoint) move with it, if it must move."""
    out = plan.config.output
    return OutputSet(plan.output, overwrite=out.overwrite, root=out.root, numbered=plan.numbered,
                     keep_frames=[k % plan.config.num_frames for k in out.keep_frames],
                     own=plan.own if movable else ())


def _sample(denoiser: WanDenoiser, latents: torch.Tensor, plan: Plan, outputs: OutputSet, vae,
            callback: ProgressCallback) -> torch.Tensor:
    """Stage 3: denoise on the plan's schedule, saving the sampler state every `checkpoint_every` steps
    (and the step a StopRender or an out-of-memory stops at); previews from each step's x0."""
    cfg, state, every = plan.config, plan.resume_state, plan.config.sampling.checkpoint_every
    newest: list[StepReport] = []        # the newest step's report: kept if the device runs out of memory
    # Previews show content: none while the guard is on, since it judges the clip before anyone sees it.
    preview = None if cfg.guard.enabled else sampling_preview(
        vae, lambda: denoiser.apply_condition(newest[0].denoised) if newest else None)

    def on_step(report: StepReport) -> None:
        newest[:] = [report]
        _step_done(report, report.step, report.total, every, outputs, cfg, callback, preview)

    take = plan.forcing          # diffusion forcing: the take's rows are its steps (vidgen.forcing)
    callback(Progress("denoise", state.step if state else 0, take.steps if take else plan.schedule.steps))
    try:
        if take is not None:
            return sample_take(denoiser, take, plan.schedule, plan.seed, tuple(latents.shape), device=latents.device,
                               dtype=denoiser.dtype, callback=on_step, state=state)
        return sample(denoiser, latents, plan.schedule, callback=on_step, state=state)
    except torch.OutOfMemoryError as e:
        raise out_of_memory(cfg, plan.memory, outputs, [r.state for r in newest], e) from e


def _step_done(report: StepReport, done: int, total: int, every: int, outputs: OutputSet, cfg: RenderConfig,
               callback: ProgressCallback, preview=None) -> None:
    """After a sampling step (`done` of `total` in the render): its checkpoint every `every` steps of the
    report's own count (and, when the callback raises StopRender, of this step, so a resume loses nothing),
    written by rank 0 of a parallel render, then the progress report."""
    saved = bool(every) and report.step % every == 0 and done < total and writes()
    if saved:
        resume.save(outputs, report.state, cfg)
    try:
        callback(Progress("denoise", done, total, preview))
    except StopRender:
        if done < total and not saved and writes():
            resume.save(outputs, report.state, cfg)
        raise


def _peak_memory(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "cuda-allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "cpu-rss"


def _result(plan: Plan, written: tuple[int, dict | None], timings: dict, latents: Path | None,
            outputs: OutputSet) -> RenderResult:
    cfg = plan.config
    frames, report = written
    peak, kind = _peak_memory(plan.target.device)
    return RenderResult(path=outputs.video, latents_path=latents, num_frames=frames, fps=cfg.output.fps or cfg.fps,
                        width=cfg.width, height=cfg.height, seed=plan.seed, config_digest=digest(cfg), timings=timings,
                        peak_memory_bytes=peak, peak_memory_kind=kind, guard=report)


def _no_progress(_: Progress) -> None:
    pass


PARALLEL_HERE = ("parallel: this pipeline renders in its own process; for a parallel config create one from it "
                 "(vidgen.Pipeline.from_config gives a ParallelPipeline, its ranks kept loaded), or use vidgen.render, "
                 "the CLI or a queue worker with --gpus")
PARALLEL_PIPELINE: Callable[[RenderConfig], Any] | None = None
"""What Pipeline.from_config gives for a parallel config: launch.ParallelPipeline.from_config, registered by
vidgen.launch (which imports this module, and which `vidgen.Pipeline` loads)."""


class StopRender(Exception):
    """Raised by a progress callback to stop a render after the current step (a queue's cancel,
    pause or shutdown). During sampling the sampler state is checkpointed first, so
    `render(..., resume=True)` continues from that step; during decode the partial video is
    deleted and the saved latents remain."""


class Pipeline:
    """A loaded Wan pipeline; `generate` renders many clips without reloading the models.

    `memo` keeps what its renders share (decode plans, the guard's classifier backend), bounded.
    """

    def __init__(self, components: Components, config: RenderConfig, placed: Target, residency: Residency,
                 memo: Memo | None = None):
        self.components = components
        self.config = config
        self.target = placed
        self.residency = residency                  # where each component lives, under the plan it loaded by
        self.memo = memo if memo is not None else Memo()
        self.applied = lora.LoraState(components)   # the LoRAs the experts carry now

    def set_loras(self, plan: Plan, auto: str = "adapter") -> None:
        """Apply `plan`'s LoRAs, taking off what the last render applied (lora.LoraState.apply)."""
        self.applied.apply(plan, auto)

    @property
    def loras(self) -> tuple:
        """What is applied now: (mode, per-expert LoRA records), or ()."""
        return self.applied.now

    @property
    def broken(self) -> bool:
        """A failed LoRA swap left the experts in an unknown state: a Renderer loads afresh."""
        return self.applied.broken

    @classmethod
    def from_config(cls, config: str | Path | dict | RenderConfig | None = None, *, overrides: Any = None,
                    **kwargs) -> "Pipeline":
        """Validate `config` (+ overrides / keyword overrides), then load the model it names. A parallel config
        (parallel.devices > 1) gives a ParallelPipeline: its ranks, each with its model loaded, kept."""
        memo, cfg = Memo(), load_config(config, _merge_overrides(overrides, kwargs))
        if cfg.parallel.devices > 1 and parallel.CURRENT is None:
            if PARALLEL_PIPELINE is None:
                raise ConfigError("parallel: vidgen.pipeline.Pipeline alone renders in one process; use vidgen.Pipeline "
                                  "(import vidgen) for a parallel config")
            return PARALLEL_PIPELINE(cfg)
        pipe = cls.load(preflight(cfg, memo=memo), memo=memo)
        # generate's default keeps output.path as given: a template names each render anew (the next free number)
        pipe.config = replace(pipe.config, output=cfg.output)
        return pipe

    @classmethod
    def load(cls, source: Plan | RenderConfig, *, memo: Memo | None = None, lora_auto: str = "adapter") -> "Pipeline":
        """Load the model a preflight Plan (or a config preflight has passed) names, with its speed
        settings applied, on the plan's device and dtypes, each component where the Residency of its
        memory plan keeps it."""
        if isinstance(source, Plan):
            cfg, placed, memory = source.config, source.target, source.memory
        else:                               # a config: its memory plan made here, as preflight makes a render's
            cfg, placed = source, target(source)
            memory = plan_render(cfg, device=placed.device, dtype=placed.dtype, vae_dtype=placed.vae_dtype,
                                 info=placed.info, memo=memo).chosen
            log.info("%s", memory.line())
        residency = Residency(memory, placed.device, offload_text=cfg.model.offload_text_encoder)
        log.info("loading %s", cfg.model.path)
        with parallel.one_rank_at_a_time(residency.sharded):   # sharded experts: read whole, one rank at a time
            components = load_components(placed.info, residency, placed.dtype, placed.vae_dtype,
                                         cast_late=isinstance(source, Plan) and bool(source.loras))
            pipe = cls(components, cfg, placed, residency, memo)
            if isinstance(source, Plan):       # LoRA before fp8 storage, streaming, torch.compile and step caches
                pipe.set_loras(source, lora_auto)
            residency.apply(components)
            if residency.sharded:              # a parallel render's rank: FSDP2 over the ranks
                parallel.shard(components.experts)
        parallel.apply(components.experts)     # diffusers' context parallelism
        if cfg.speed.engaged():
            apply_speed(components, cfg.speed)
        return pipe

    def loaded_for(self, cfg: RenderConfig) -> bool:
        """Whether `cfg` renders with this pipeline as loaded: the same model, vae, memory and speed
        settings, and under fp8 or streaming (memory.wraps_weights) the same LoRAs."""
        return (not self.broken and cfg.model == self.config.model and cfg.vae == self.config.vae and cfg.speed == self.config.speed
                and cfg.memory == self.config.memory
                and (not wraps_weights(self.residency.memory) or cfg.loras == self.config.loras))

    def generate(self, config: str | Path | dict | RenderConfig | None = None, *,
                 callback: ProgressCallback | None = None, overrides: Any = None, **kwargs) -> RenderResult:
        """Render one clip. `config` replaces the pipeline's config; overrides apply on top.

        Returns:
            RenderResult with the output path, frame count, seed, timings and peak memory.
        """
        cfg = load_config(self.config if config is None else config, _merge_overrides(overrides, kwargs))
        return Renderer(self, reload=False).render(cfg, callback)

    @torch.no_grad()
    def run(self, plan: Plan, callback: ProgressCallback) -> RenderResult:
        """Run a preflight Plan on this pipeline (see Renderer.render, which makes the plan)."""
        c, cfg, timings = self.components, plan.config, {}
        if c.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(c.device)
        ensure_folder(plan.output, cfg.output.root)      # checkpoints and latents are written beside the video

        # 1. Encode the prompt (and the negative prompt when any expert uses guidance).
        t0 = time.perf_counter()
        callback(Progress("encode", 0, 1))
        prompts = [cfg.prompt] + ([cfg.negative_prompt] if any(s > 1.0 for s in plan.guidance) else [])
        embeds = encode_with(c, self.residency, prompts, max_sequence_length=cfg.model.max_sequence_length)
        callback(Progress("encode", 1, 1))
        timings["encode"] = time.perf_counter() - t0
        if plan.animate is not None:        # Wan2.2-Animate: segment by segment, each decoded as it is made
            return self._animate(plan, embeds, callback, timings)

        # 2-3. Initial noise and the conditions, then denoise on the plan's schedule.
        t0 = time.perf_counter()
        latents = initial_latents(plan, c.device)
        if plan.source is not None and plan.resume_state is None:     # video2video: the source noised
            with self.residency.visit("vae", c.vae, "encode"):
                latents = restyle_start(c.vae, plan.source, latents, float(plan.schedule.sigmas[0]))
        denoiser = build_denoiser(c, self.residency, plan, embeds, latents)
        outputs = _outputs(plan)       # the checkpoint, latents, sidecar and video: one name, never another's
        sampled = _sample(denoiser, latents, plan, outputs, c.vae, callback)[:, :, plan.reference_frames:]  # VACE: refs off
        latents, timings["denoise"] = denoiser.apply_condition(sampled), time.perf_counter() - t0
        if not writes():                # a parallel render's other ranks: rank 0 writes every file
            return _result(plan, (0, None), timings, None, outputs)

        # 4. Save the latents before decoding, so a failed decode never loses the sampling.
        save_latents(outputs, latents, cfg, c.info.variant, plan.job)
        outputs.remove("resume")

        # 5-6. Decode and stream frames to the video file (its sidecar first), the swapped expert moved
        # off the device first (the memory plan gives the decode what the experts leave).
        denoiser.switch.release()
        with self.residency.visit("vae", c.vae, "decode"):
            written = decode_and_write(c.vae, latents, plan, callback, timings, outputs, Progress)
        if not cfg.output.save_latents:
            outputs.remove("latents")      # this render wrote it: it may delete it (and nothing else)
        return _result(plan, written, timings, outputs.path("latents") if cfg.output.save_latents else None, outputs)


    def _animate(self, plan: Plan, embeds: torch.Tensor, callback: ProgressCallback, timings: dict) -> RenderResult:
        """Stages 2-6 of an Animate render: its segments sampled and decoded (vidgen.animate_render), a
        checkpoint (the finished segments and the sampler state) every `checkpoint_every` steps and at a
        StopRender, then the frames written as any render's."""
        c, cfg = self.components, plan.config
        outputs, steps = _outputs(plan), plan.schedule.steps
        total, every, newest = plan.animate.segments.num_segments * steps, cfg.sampling.checkpoint_every, []
        kept = replace(cfg, num_frames=plan.animate.given_frames)     # as configured: a resume reads the videos again

        def on_step(k: int, report: StepReport) -> None:       # every segment's steps counted in turn
            newest[:] = [report]
            _step_done(report, k * steps + report.step, total, every, outputs, kept, callback)

        state, t0 = plan.resume_state, time.perf_counter()
        callback(Progress("denoise", len(state.segments) * steps + state.step if state else 0, total))
        try:
            frames, latents = animate_render.render(c, self.residency, plan, embeds, on_step)
        except torch.OutOfMemoryError as e:
            raise out_of_memory(kept, plan.memory, outputs, [r.state for r in newest], e) from e
        timings["denoise"] = time.perf_counter() - t0
        if cfg.output.save_latents:      # every segment's latents: `vidgen decode` and a take's review decode them
            save_latents(outputs, latents, kept, c.info.variant, plan.job)
        outputs.remove("resume")
        written = decode_and_write(c.vae, None, plan, callback, timings, outputs, Progress, frames=frames)
        return _result(plan, written, timings, outputs.path("latents") if cfg.output.save_latents else None, outputs)


class Renderer:
    """The one render path: preflight — on the warm pipeline's facts when it can render the config
    — then load (only when it cannot), then run. Holds at most one loaded Pipeline between renders.

    reload=False (Pipeline.generate): a config the pipeline cannot render is an error, not a reload.
    """

    def __init__(self, pipeline: Pipeline | None = None, *, reload: bool = True, lora_auto: str = "adapter"):
        self.pipeline, self.reload, self.lora_auto = pipeline, reload, lora_auto

    def render(self, cfg: RenderConfig, callback: ProgressCallback | None = None, *,
               resume_state: SamplerState | None = None, own: tuple[Path, ...] = (),
               job: dict | None = None) -> RenderResult:
        """Render `cfg` (loaded and checked); `resume_state`, `own` and `job` as in preflight."""
        if cfg.parallel.devices > 1 and parallel.CURRENT is None:
            raise ConfigError(PARALLEL_HERE)
        warm = self.pipeline if self.pipeline is not None and self.pipeline.loaded_for(cfg) else None
        if warm is None and not self.reload and self.pipeline is not None and self.pipeline.broken:
            raise ConfigError("this pipeline could not take a failed LoRA swap off; create a new Pipeline")
        if warm is None and not self.reload:
            raise ConfigError("model/vae/speed settings differ from the loaded pipeline's; create a new Pipeline for them")
        memo = warm.memo if warm is not None else Memo()
        plan = preflight(cfg, target=warm.target if warm is not None else None, own=own,
                         resume_state=resume_state, job=job, memo=memo)
        if warm is not None and not same_policy(plan.memory, warm.residency.memory):
            if not self.reload:     # this size needs the weights held another way than they are loaded
                raise ConfigError(f"this render's {plan.memory.line()} differs from the loaded pipeline's; create "
                                  "a new Pipeline for it")
            warm, memo = None, Memo()
            plan = preflight(cfg, own=own, resume_state=resume_state, job=job, memo=memo)
        if warm is None:
            self.pipeline = None        # free the old model before loading the new
            self.pipeline = warm = Pipeline.load(plan, memo=memo, lora_auto=self.lora_auto)
        else:
            warm.set_loras(plan, self.lora_auto)
        return warm.run(plan, callback or _no_progress)


def _merge_overrides(overrides: Any, kwargs: dict) -> Any:
    if overrides is None:
        return kwargs or None
    if not kwargs or not isinstance(overrides, (dict, list, tuple)):
        return overrides                # load_config says what is wrong with any other kind
    if isinstance(overrides, dict):
        return {**overrides, **kwargs}
    return [*overrides, kwargs]         # keyword values stay values (a str key's KEY=VALUE would be its text)


def decode_latents(path: str | Path, *, callback: ProgressCallback | None = None, overrides: Any = None,
                   job: dict | None = None, **kwargs) -> RenderResult:
    """Finish a render from its saved latents: decode and write its video with the saved settings.

    Where the video goes, and whether anything may be replaced, come from the caller, never from
    the file (settings in a file someone sent are not permission): by default the video goes beside
    the latents file, named after it (x.latents.safetensors -> x.mp4, in the container the render
    used), and nothing is replaced unless the overrides say output.overwrite=true. `job`: the queue job's
    identity, recorded in the sidecar (a review job's approval with it).
    """
    latents, saved = read_latents(path)
    cfg = load_config(_decode_defaults(saved, Path(path)), _merge_overrides(overrides, kwargs))
    plan = preflight(cfg, own=(Path(path).absolute(),), memo=Memo(), job=job)
    info, placed = plan.info, plan.target
    expected = (animate_render.latents_shape(plan) if plan.animate is not None else     # Animate: its segments'
                info.latent_shape(plan.config.width, plan.config.height, plan.config.num_frames))
    if tuple(latents.shape) != expected:
        raise InputError(f"latents shape {list(latents.shape)} does not match the config (expected {list(expected)})")
    if placed.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(placed.device)
    vae = load_vae(info, placed.device, placed.vae_dtype)
    timings: dict[str, float] = {}
    outputs = _outputs(plan, movable=False)      # the latents file decoded stays where the user has it
    frames = None
    if plan.animate is not None:
        t0 = time.perf_counter()
        frames = animate_render.frames_of(vae, latents, plan)
        timings["decode"] = time.perf_counter() - t0
    written = decode_and_write(vae, latents, plan, callback or _no_progress, timings, outputs,
                               Progress, frames=frames)
    return _result(plan, written, timings, Path(path), outputs)


def _decode_defaults(saved: dict, latents_file: Path) -> dict:
    """The saved config with the output the decode writes by default: the latents file's own name
    and folder, the exact decode; no overwrite and no output.root from the file (the caller's overrides
    may set them)."""
    out = saved.get("output")
    out = dict(out) if isinstance(out, dict) else {}
    ext = Path(str(out.get("path", ""))).suffix.lower()        # the container the render chose, not a place
    ext = ext if ext in {e for spec in CODECS.values() for e in spec.extensions} else ".mp4"
    name = latents_file.name.removesuffix(".safetensors").removesuffix(".latents") or "decoded"
    out.update(path=literal(str(latents_file.absolute().with_name(name + ext))), overwrite=False, root=None,
               decode="full")          # a take's review copy came from the preview map: decoding is the VAE's
    return {**saved, "output": out}
