"""Where a render starts: `vidgen.render` in this process, or a parallel render's ranks (vidgen.parallel).

`render` is the function behind `vidgen.render` and `vidgen render`: a config (with overrides, and a
checkpoint to resume) to a finished clip through the one render path, `pipeline.Renderer`. A config with
`parallel.devices` > 1 is checked here once, then rendered by its ranks (`render_ranks`); each rank runs
`render_rank`. `ParallelPipeline` keeps its ranks, each with its model loaded, between renders (each rank
runs `render_warm`): `vidgen.Pipeline.from_config` gives one for a parallel config, and a queue worker
holding several devices keeps one between its jobs.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from . import parallel, pipeline
from .config import RenderConfig
from .errors import ConfigError
from .pipeline import Pipeline, Progress, ProgressCallback, Renderer, RenderResult, _merge_overrides
from .preflight import preflight
from .presets import load_config
from .resume import Start, start_render


def render(config: str | Path | dict | RenderConfig | None = None, *, callback: ProgressCallback | None = None,
           overrides: Any = None, resume: bool | str | Path | None = None, **kwargs) -> RenderResult:
    """Render one clip from a config (path, dict or RenderConfig) with optional overrides.

    `vidgen.render("configs/tiny.yaml", prompt="a fox", **{"sampling.steps": 4})`

    Args:
        resume: continue an interrupted render from a checkpoint: its path, or True for the newest
            `*.resume.safetensors` in the output folder. Settings must match the checkpoint's.
    """
    start = start_render(load_config(config, _merge_overrides(overrides, kwargs)), resume)
    if start.config.parallel.devices > 1 and parallel.CURRENT is None:     # the ranks: spawned here, or torchrun's
        return render_ranks(start, callback)
    return Renderer(lora_auto="fuse").render(start.config, callback, resume_state=start.state, own=start.own)


def render_ranks(start, callback: ProgressCallback | None = None, job: dict | None = None) -> RenderResult:
    """A parallel render (vidgen.parallel) from its launcher: checked here, once, before any rank starts (one
    seed, one output path for all), then its ranks spawned here, or this process joins torchrun's as one."""
    plan = preflight(start.config, own=start.own, resume_state=start.state, job=job)
    start, device = replace(start, config=plan.config), plan.target.device.type
    if (ranks := parallel.torchrun_rank()) is None:
        return parallel.launch(start, render_rank, callback and (lambda *p: callback(Progress(*p))), device, job)
    parallel.join(*ranks, start.config.parallel, device, start.config.parallel.timeout)
    return Renderer(lora_auto="fuse").render(start.config, callback, resume_state=start.state, own=start.own, job=job)


def render_rank(start, progress, job: dict | None = None) -> RenderResult:
    """One rank's part of a parallel render (rank 0 writes the files); `progress(stage, step, total)`."""
    report = (lambda p: progress(p.stage, p.step, p.total)) if progress else None
    return Renderer(lora_auto="fuse").render(start.config, report, resume_state=start.state, own=start.own, job=job)


_WARM: Renderer | None = None
"""A serving rank's renderer (ParallelPipeline): its model stays loaded between requests."""


def render_warm(start, progress, job: dict | None = None) -> RenderResult:
    """One rank's part of a ParallelPipeline render, on the rank's warm renderer (LoRAs as adapters)."""
    global _WARM
    _WARM = _WARM or Renderer(lora_auto="adapter")
    report = (lambda p: progress(p.stage, p.step, p.total)) if progress else None
    return _WARM.render(start.config, report, resume_state=start.state, own=start.own, job=job)


class ParallelPipeline:
    """vidgen.Pipeline for a parallel config (what `vidgen.Pipeline.from_config` gives for one): its ranks are
    spawned once, and each keeps its model loaded between renders (close() or a `with` block stops them).
    Every render is checked here first. A queue worker holding several devices keeps one for its jobs."""

    def __init__(self, config: RenderConfig):
        self.config, self.ranks = config, None

    @classmethod
    def from_config(cls, config: str | Path | dict | RenderConfig | None = None, *, overrides: Any = None,
                    **kwargs) -> "ParallelPipeline":
        cfg = load_config(config, _merge_overrides(overrides, kwargs))
        if cfg.parallel.devices < 2:
            raise ConfigError("parallel.devices: a ParallelPipeline needs 2 or more ranks; use vidgen.Pipeline")
        preflight(cfg)
        return cls(cfg)

    def generate(self, config: str | Path | dict | RenderConfig | None = None, *,
                 callback: ProgressCallback | None = None, overrides: Any = None, **kwargs) -> RenderResult:
        """Render one clip on the warm ranks (`config` replaces the pipeline's; overrides apply on top)."""
        cfg = load_config(self.config if config is None else config, _merge_overrides(overrides, kwargs))
        if (cfg.parallel, cfg.model) != (self.config.parallel, self.config.model):
            raise ConfigError("parallel / model: differ from this ParallelPipeline's ranks; create a new one for them")
        return self.run(Start(cfg), callback)

    def run(self, start: Start, callback: ProgressCallback | None = None, job: dict | None = None) -> RenderResult:
        """Render `start` (resume.Start: a checkpoint to continue, the files it owns) on the warm ranks, which
        are spawned on first use and again after a failed render. Its parallel settings must be the ranks'."""
        if start.config.parallel != self.config.parallel:
            raise ConfigError("parallel: differs from these ranks' layout; create a new ParallelPipeline for it")
        plan = preflight(start.config, own=start.own, resume_state=start.state, job=job)
        if self.ranks is None or not self.ranks.alive:
            self.ranks = parallel.Ranks(self.config.parallel, plan.target.device.type, self.config.parallel.timeout,
                                        render_warm)
        return self.ranks.run(replace(start, config=plan.config), job,
                              callback and (lambda *p: callback(Progress(*p))))

    def close(self) -> None:
        if self.ranks is not None:
            self.ranks.close()
            self.ranks = None

    def __enter__(self) -> "ParallelPipeline":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


pipeline.PARALLEL_PIPELINE = ParallelPipeline.from_config
__all__ = ["ParallelPipeline", "Pipeline", "render", "render_ranks", "render_rank", "render_warm"]
