"""Runs claimed jobs in this process: render (one warm Pipeline, reloaded only when the model
changes), stitch and contact_sheet. Job kinds are registered names, never import paths.

A background thread renews the job's lease (heartbeat) and picks up cancel/pause requests; the
render's progress callback raises StopRender at the next step when one arrived (or when the
worker is shutting down), after the pipeline has checkpointed the step. Failures are classified
for the ledger: bad input or config -> no retry; guard block -> blocked-by-guard; out of memory ->
retry with lower memory settings; this machine lacks a package or device (errors.environment_problem)
-> back in the queue, the attempt not counted, and the worker stops after ENVIRONMENT_STREAK such
failures in a row for one reason; anything else -> retry with backoff.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..errors import EnvironmentProblem, GuardrailBlocked, VidgenError, environment_problem
from ..pipeline import Progress, Renderer, StopRender
from ..preflight import preflight
from ..threads import set_cpu_threads
from .ledger import Control, FailureKind, Job, JobSpec, Ledger

log = logging.getLogger("vidgen")

PREVIEW_EVERY_S = 1.0       # a running render's preview image is rewritten at most this often (and at each new stage)
ENVIRONMENT_STREAK = 3      # a worker stops after this many environment failures in a row for the same reason


class _LogTo(logging.Handler):
    """Sends vidgen's log records during a job to `sink` (the ledger's attempt log, or a list)."""

    def __init__(self, sink: Callable[[str], None]):
        super().__init__(logging.INFO)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink(record.getMessage())


class _Heartbeat(threading.Thread):
    """Renews the executor's lease on `job` every `ex.heartbeat_s` seconds with the latest progress;
    remembers the control signal."""

    def __init__(self, ex: "Executor", job: Job):
        super().__init__(daemon=True, name=f"heartbeat-{job.id}")
        self.ex, self.job = ex, job
        self.control = Control.CONTINUE
        self._done = threading.Event()

    def run(self) -> None:
        ex = self.ex
        first = True        # beat at once: a cancel or pause requested while the job waited is seen early
        while first or not self._done.wait(ex.heartbeat_s):
            first = False
            try:
                c = ex.ledger.heartbeat(self.job.id, ex.owner, ex.lease_s, progress=ex.last_progress)
            except Exception as e:      # a busy ledger: keep working, the lease tells the truth
                log.warning("heartbeat for job #%d failed: %s", self.job.id, e)
                continue
            if c != Control.CONTINUE:
                self.control = c

    def stop(self) -> None:
        self._done.set()


def lower_memory(payload: dict) -> dict:
    """The payload patch for a retry after running out of memory: half the VAE budget (at least
    256 MiB; from auto: 1 GiB), and the memory plan's next cheaper candidate after the one this
    payload plans to (vidgen.memory: expert swapping, then fp8, then streamed blocks)."""
    from ..budgets import parse_budget
    from ..errors import VidgenError
    from ..memory import next_cheaper
    from ..presets import load_config

    budget = parse_budget((payload.get("vae") or {}).get("memory_budget", "auto"))
    new = "1GiB" if budget in (None, "auto") else str(max(256 << 20, int(budget) // 2))
    patch: dict = {"vae": {"memory_budget": new}}
    try:
        cheaper = next_cheaper(load_config(payload))
    except VidgenError:         # the plan itself fails now (its retry will say why): stream, the leanest
        cheaper = ("stream_blocks", "fp8")
    if cheaper is not None:
        patch.update(memory={"placement": cheaper[0], "weights": cheaper[1]}, model={"offload": "auto"})
    return patch


@dataclass
class Outcome:
    """How a job run ended, before the ledger hears of it (a Ray actor returns this to its dispatcher)."""

    status: str                         # succeeded | failed | stopped
    output: str | None = None
    result: dict | None = None
    error: str = ""
    kind: FailureKind | None = None     # for failed
    patch: dict | None = None           # payload changes for the retry (out of memory)
    stop: str = ""                      # for stopped: cancel | pause | shutdown | lost
    logs: list[str] = field(default_factory=list)
    environment: bool = False           # failed for want of a package or device here: give the job back


class _Streak:
    """Environment failures in a row with one reason (any other outcome but a stop breaks the row)."""

    def __init__(self):
        self.reason, self.jobs = "", []

    def add(self, job: Job, outcome: Outcome) -> None:
        if outcome.status == "stopped":
            return
        if not (outcome.status == "failed" and outcome.environment):
            self.reason, self.jobs = "", []
            return
        if outcome.error != self.reason:
            self.reason, self.jobs = outcome.error, []
        self.jobs.append(job.id)

    def stop_reason(self) -> str | None:
        if len(self.jobs) < ENVIRONMENT_STREAK:
            return None
        ids = ", ".join(f"#{i}" for i in dict.fromkeys(self.jobs))
        return (f"worker stopped: {len(self.jobs)} attempts in a row (jobs {ids}) failed for want of something on "
                f"this machine, not for the jobs: {self.reason}; the jobs are queued again, their attempts not "
                "counted: fix the environment and start the worker again")


class Executor:
    """Runs jobs for one worker (`owner`) and holds the warm pipeline between them.

    `run(job)` executes and classifies without touching the ledger; `execute(job)` adds the
    heartbeat thread, live job logs and the ledger update (the local worker). `control` is asked
    at every progress report whether to stop.
    """

    def __init__(self, ledger: Ledger | None, owner: str, *, lease_s: float = 60.0,
                 heartbeat_s: float | None = None):
        self.ledger, self.owner, self.lease_s = ledger, owner, lease_s
        # At most 2 s: the beat also carries the progress the queue page shows.
        self.heartbeat_s = heartbeat_s or min(2.0, max(0.2, lease_s / 4))
        self.renderer = Renderer()      # holds the warm pipeline between jobs
        self.stopping = False           # set by the worker on SIGTERM
        self.control: Callable[[], str | None] = lambda: None
        self.last_progress: dict | None = None
        self.preview_to: Path | None = None     # where the running render's preview goes (<output>.preview.png)
        self._streak = _Streak()
        self.cpu_threads = 0            # torch threads this worker's last CPU render set (vidgen.threads)
        self._preview_due, self._preview_stage = 0.0, ""

    # -- running one job ---------------------------------------------------------------------
    def progress(self, p: Progress) -> None:
        """The pipeline's progress callback: report, write the preview when one is due, and stop at
        this step when asked."""
        self.last_progress = {"stage": p.stage, "step": p.step, "total": p.total}
        if p.preview is not None and self.preview_to is not None and p.step > 0 and (
                time.monotonic() >= self._preview_due or p.stage != self._preview_stage):
            self._preview_due, self._preview_stage = time.monotonic() + PREVIEW_EVERY_S, p.stage
            self._write_preview(p)
        why = "shutdown" if self.stopping else self.control()
        if why:
            raise StopRender(why)

    def _write_preview(self, p: Progress) -> None:
        from .. import preview

        try:
            rgb = p.preview()
            if rgb is not None:
                preview.write(self.preview_to, rgb)
        except Exception as e:          # a preview must never fail the render: say so once, stop trying
            log.warning("previews off for this job: %s", f"{type(e).__name__}: {e}".splitlines()[0])
            self.preview_to = None

    def run(self, job: Job, on_log: Callable[[str], None] | None = None) -> Outcome:
        lines: list[str] = []
        handler = _LogTo(on_log or lines.append)
        logger = logging.getLogger("vidgen")
        level = logger.level
        logger.setLevel(min(logger.getEffectiveLevel(), logging.INFO))   # the job log keeps INFO lines
        logger.addHandler(handler)
        try:
            output, result = KINDS[job.kind](self, job)
            return Outcome("succeeded", output=output, result=result, logs=lines)
        except StopRender as stop:
            return Outcome("stopped", stop=str(stop), logs=lines)
        except GuardrailBlocked as e:
            return Outcome("failed", error=str(e), kind=FailureKind.GUARD, result={"guard": e.report}, logs=lines)
        except torch.OutOfMemoryError as e:    # before VidgenError: memory.SamplingOutOfMemory is both
            lines.append(traceback.format_exc())
            return Outcome("failed", error=f"out of memory: {e}".splitlines()[0], kind=FailureKind.OOM, logs=lines,
                           patch=lower_memory(job.payload) if job.kind == "render" else None)
        except Exception as e:
            if (why := environment_problem(e)) is not None:     # the job is fine; this machine is not
                if not isinstance(e, EnvironmentProblem):
                    lines.append(traceback.format_exc())
                return Outcome("failed", error=why, kind=FailureKind.OTHER, logs=lines, environment=True)
            if isinstance(e, VidgenError):  # bad config, input, model folder, output: a retry cannot help
                return Outcome("failed", error=str(e), kind=FailureKind.CONFIG, logs=lines)
            lines.append(traceback.format_exc())
            return Outcome("failed", error=f"{type(e).__name__}: {e}".splitlines()[0], kind=FailureKind.OTHER,
                           logs=lines)
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)

    def record(self, job: Job, outcome: Outcome) -> str:
        """Apply an outcome to the ledger (as this executor's owner); returns what happened."""
        ledger, owner = self.ledger, self.owner
        self._streak.add(job, outcome)
        if outcome.status == "failed" and outcome.environment:
            _safe_log(ledger, job.id, f"not run on {owner}: {outcome.error}; queued again, the attempt not counted")
            ledger.release(job.id, owner)
            return "released"
        if outcome.status == "succeeded":
            return "succeeded" if ledger.complete(job.id, owner, output=outcome.output, result=outcome.result) else "lost"
        if outcome.status == "failed":
            return ledger.fail(job.id, owner, outcome.error, outcome.kind, payload_patch=outcome.patch).value
        if outcome.stop == Control.CANCEL.value:
            ledger.finish_canceled(job.id, owner)
            return "canceled"
        if outcome.stop == Control.LOST.value:
            return "lost"               # another worker holds it now: leave the ledger alone
        ledger.release(job.id, owner, paused=outcome.stop == Control.PAUSE.value)
        return "paused" if outcome.stop == Control.PAUSE.value else "released"

    def stop_reason(self) -> str | None:
        """Why this worker should stop taking jobs (its environment fails them all), or None."""
        return self._streak.stop_reason()

    def execute(self, job: Job) -> str:
        """Run `job` with heartbeats and live logs, then record its end in the ledger."""
        self.last_progress = None       # the first beat must not carry the previous job's last step
        beat = _Heartbeat(self, job)
        self.control = lambda: None if beat.control == Control.CONTINUE else beat.control.value
        beat.start()
        _safe_log(self.ledger, job.id, f"attempt {job.attempts} on {self.owner}")
        try:
            outcome = self.run(job, on_log=lambda text: _safe_log(self.ledger, job.id, text))
        finally:
            beat.stop()
            self.control = lambda: None
        for text in outcome.logs:
            _safe_log(self.ledger, job.id, text)
        what = self.record(job, outcome)
        _safe_log(self.ledger, job.id, what + (f": {outcome.error}" if outcome.error else ""))
        return what


def _safe_log(ledger: Ledger, job_id: int, text: str) -> None:
    try:
        ledger.log(job_id, text)
    except Exception:                   # a log line must never fail the job
        pass


# ------------------------------------------------------------------------------- job kinds


def job_identity(job: Job, cfg) -> dict:
    """What a render's sidecar records of the job that made it: a later attempt of the same job
    recognises its own finished file by this, and any other file at the path is not its own."""
    from ..config import digest

    return {"id": job.id, "created": job.created, "config_digest": digest(cfg)}


def _earlier_attempt(out: Path, identity: dict) -> tuple[bool, Path | None, Path | None]:
    """What earlier attempts of this job left at `out`: (whether the video is finished, the sidecar
    and the latents beside it if they name this job, else None). Anything else there belongs to
    someone else, and preflight refuses it."""
    import json

    from .. import resume
    from ..errors import InputError
    from ..paths import sidecar_path

    side = sidecar_path(out)
    try:
        mine = json.loads(side.read_text()).get("job") == identity
    except (OSError, ValueError, AttributeError):
        mine = False
    if mine and out.exists():
        return True, None, None
    latents = resume.latents_path(out)
    try:        # the header only; "job" must be there, as JSON
        meta = resume.read_metadata(latents, resume.LATENTS_FORMAT, "vidgen latents file", "is not vidgen's",
                                        ("job",), "")
        latents_mine = json.loads(meta["job"]) == identity
    except InputError:      # missing, damaged or another's: preflight decides
        latents_mine = False
    return False, side if mine else None, latents if latents_mine else None


def _resume_state(cfg, out: Path, job: Job):
    """(cfg, sampler state) from the job's own checkpoint, if one is there; a damaged or foreign
    checkpoint is set aside (renamed, logged) and the job starts from step 0 instead of failing."""
    import time

    from .. import resume
    from ..errors import ConfigError, InputError

    path = resume.resume_path(out)
    if not path.exists():
        return cfg, None
    try:
        cfg, state = resume.resume_from(cfg, path)
    except (InputError, ConfigError) as e:
        aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
        path.rename(aside)
        log.warning("job #%d: set the checkpoint aside as %s and started from step 0: %s", job.id, aside.name, e)
        return cfg, None
    log.info("resuming job #%d at step %d of %d", job.id, state.step, state.steps)
    return cfg, state


def _render(ex: Executor, job: Job) -> tuple[str, dict]:
    from .. import resume
    from ..presets import load_config
    from ..io import output_path
    from ..paths import preview_path

    cfg = load_config(job.payload)
    out = output_path(cfg.output.path, cfg.seed, cfg.prompt)
    identity = job_identity(job, cfg)
    finished, stale_sidecar, own_latents = _earlier_attempt(out, identity)
    if finished:
        # At-least-once delivery: an earlier attempt of this job finished the output before its
        # worker died; the writer only renames a complete file into place, so it is whole. Keep it.
        return str(out), {"reused": True}
    if stale_sidecar is not None:     # renamed just before the worker died: the video will follow it again
        stale_sidecar.unlink()
    own = [own_latents] if own_latents is not None else []
    # (anything else at the path is not this job's: preflight refuses it unless output.overwrite is set)
    cfg, state = _resume_state(cfg, out, job)
    if state is not None:
        own.append(resume.resume_path(out))
    # preflight runs before any model (re)load: a bad job costs no load
    # The preview belongs to the render in progress: an earlier attempt's goes now, and this one's goes
    # when the attempt ends in any way (done, failed, canceled, paused, shut down); a resumed job draws afresh.
    ex.preview_to, ex._preview_due, ex._preview_stage = preview_path(out), 0.0, ""
    preview_path(out).unlink(missing_ok=True)
    ex.cpu_threads = set_cpu_threads(cfg, log=log) or 0
    try:
        result = ex.renderer.render(cfg, ex.progress, resume_state=state, own=tuple(own), job=identity)
    finally:
        ex.preview_to = None
        preview_path(out).unlink(missing_ok=True)
    return str(result.path), {"num_frames": result.num_frames, "seed": result.seed, "timings": result.timings,
                              "guard": result.guard}


def _stitch(ex: Executor, job: Job) -> tuple[str, dict]:
    from .steps import run_stitch

    out = run_stitch(job.payload, progress=lambda step, total: ex.progress(Progress("stitch", step, total)))
    return str(out), {}


def _contact_sheet(ex: Executor, job: Job) -> tuple[str, dict]:
    from .steps import run_contact_sheet

    return str(run_contact_sheet(job.payload)), {}


KINDS: dict[str, Callable[[Executor, Job], tuple[str, dict]]] = {
    "render": _render, "stitch": _stitch, "contact_sheet": _contact_sheet,
}
"""Each of jobs.JOB_KINDS (the names the ledger accepts) and how it runs."""


def check_specs(specs: list[JobSpec]) -> None:
    """Every check a job would run before loading weights, run now for a submit: render jobs get
    preflight (prompt filter, model folder JSON, image, every output file) without loading the
    guard's classifier; stitch and contact_sheet jobs check their output. Raises the first error
    (a blocked prompt is GuardrailBlocked, exit 3)."""
    from ..presets import load_config
    from ..paths import kept_frame_path
    from ..sources import inspect
    from .steps import check_step

    infos: dict[str, object] = {}
    pending: dict[str, tuple[int, int]] = {}        # frames earlier jobs keep for later ones: path -> size
    for spec in specs:
        if spec.kind == "render":
            cfg = load_config(spec.payload)
            key = repr(cfg.model)
            info = infos.get(key) or inspect(cfg.model)
            infos[key] = info
            plan = preflight(cfg, info, load_guard=False, pending=pending)
            pending.update({os.path.abspath(kept_frame_path(plan.output, k % plan.config.num_frames)):
                            (plan.config.width, plan.config.height) for k in plan.config.output.keep_frames})
        elif spec.kind in KINDS:
            check_step(spec.kind, spec.payload)

