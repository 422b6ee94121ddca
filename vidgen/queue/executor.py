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

import dataclasses
import logging
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from .. import preview, resume
from ..budgets import parse_budget
from ..config import digest
from ..errors import EnvironmentProblem, GuardrailBlocked, VidgenError, environment_problem
from ..io import output_path
from ..memory import next_cheaper
from ..outofmemory import SamplingOutOfMemory
from ..launch import ParallelPipeline
from ..paths import latents_path, preview_path
from ..pipeline import Progress, Renderer, StopRender, decode_latents
from ..presets import load_config
from ..threads import set_cpu_threads
from .ledger import Control, FailureKind, Job, Ledger
from .review import ReviewJob
from .steps import run_contact_sheet, run_stitch

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


def lower_memory(payload: dict, error: BaseException | None = None) -> dict:
    """The payload patch for a retry after running out of memory (`error`): half the VAE budget (at
    least 256 MiB; from auto: 1 GiB), and the memory plan's next cheaper candidate after the one this
    payload plans to (vidgen.memory: expert swapping, then fp8, then streamed blocks).

    An out-of-memory while sampling (outofmemory.SamplingOutOfMemory) names that candidate, worked out as
    it was raised (its message's hint); any other (the decode's, say) is planned again here, as is
    one that names none (its plan was the leanest, or planning failed: the error does not say which).
    """
    budget = parse_budget((payload.get("vae") or {}).get("memory_budget", "auto"))
    new = "1GiB" if budget in (None, "auto") else str(max(256 << 20, int(budget) // 2))
    patch: dict = {"vae": {"memory_budget": new}}
    cheaper = error.cheaper if isinstance(error, SamplingOutOfMemory) else None
    if cheaper is None:
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
        self.ranks: ParallelPipeline | None = None      # a --gpus worker's ranks, each with its model, between jobs
        self.facts = None               # schedule.WorkerFacts the worker declared: its renders plan in those budgets
        self.stopping = False           # set by the worker on SIGTERM
        self.control: Callable[[], str | None] = lambda: None
        self.last_progress: dict | None = None
        self.preview_to: Path | None = None     # where the running render's preview goes (<output>.preview.png)
        self._streak = _Streak()
        self.cpu_threads = 0            # torch threads this worker's last CPU render set (vidgen.threads)
        self._preview_due, self._preview_stage = 0.0, ""

    def warm_ranks(self, cfg) -> ParallelPipeline:
        """The ranks for a parallel job: the last job's when its parallel layout was this one (each rank's
        model kept, reloaded only where the job's model differs), else new ones. The one-process pipeline
        is let go first: one warm model on these devices at a time."""
        self.renderer.pipeline = None
        if self.ranks is not None and self.ranks.config.parallel != cfg.parallel:
            self.close_ranks()
        self.ranks = self.ranks or ParallelPipeline(cfg)
        return self.ranks

    def close_ranks(self) -> None:
        """Stop the warm ranks, if any (after a job, before a one-process render, when the worker ends)."""
        if self.ranks is not None:
            self.ranks.close()
            self.ranks = None

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
        except torch.OutOfMemoryError as e:    # before VidgenError: outofmemory.SamplingOutOfMemory is both
            lines.append(traceback.format_exc())
            return Outcome("failed", error=f"out of memory: {e}".splitlines()[0], kind=FailureKind.OOM, logs=lines,
                           patch=lower_memory(job.payload, e) if job.kind == "render" else None)
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
    return {"id": job.id, "created": job.created, "config_digest": digest(cfg)}


def _render(ex: Executor, job: Job) -> tuple[str, dict]:
    cfg = load_config(job.payload)
    out = output_path(cfg.output.path, cfg.seed, cfg.prompt)
    identity = job_identity(job, cfg)
    start = resume.start_job(cfg, out, identity)     # what earlier attempts of this job left at `out`
    if start.finished:
        return str(out), {"reused": True}
    start = _in_budgets(start, ex.facts)
    # preflight runs before any model (re)load: a bad job costs no load
    # The preview belongs to the render in progress: an earlier attempt's goes now, and this one's goes
    # when the attempt ends in any way (done, failed, canceled, paused, shut down); a resumed job draws afresh.
    ex.preview_to, ex._preview_due, ex._preview_stage = preview_path(out), 0.0, ""
    preview_path(out).unlink(missing_ok=True)
    ex.cpu_threads = set_cpu_threads(start.config, log=log) or 0
    try:
        if start.config.parallel.devices > 1:     # on the worker's ranks, kept warm between such jobs
            result = ex.warm_ranks(start.config).run(start, ex.progress, identity)
        else:
            ex.close_ranks()
            result = ex.renderer.render(start.config, ex.progress, resume_state=start.state, own=start.own,
                                        job=identity)
    finally:
        ex.preview_to = None
        preview_path(out).unlink(missing_ok=True)
    device = torch.cuda.get_device_name() if result.peak_memory_kind.startswith("cuda") else "cpu"
    return str(result.path), {"num_frames": result.num_frames, "seed": result.seed, "timings": result.timings,
                              "guard": result.guard, "device": device}     # the cost estimate learns per device


def _in_budgets(start, facts):
    """`start` with the worker's declared memory as the budgets its config leaves to `auto`: the planner
    then picks the fastest way that fits this worker's card (the job was claimed because one does)."""
    mem = start.config.memory
    if facts is None or start.config.model.device == "cpu" and facts.device_type != "cpu":
        return start
    budgets = {"device_budget": facts.device_bytes if mem.device_budget == "auto" and facts.device_bytes else None,
               "host_budget": facts.host_bytes if mem.host_budget == "auto" and facts.host_bytes else None}
    if not any(budgets.values()):
        return start
    memory = dataclasses.replace(mem, **{k: v for k, v in budgets.items() if v})
    return dataclasses.replace(start, config=dataclasses.replace(start.config, memory=memory))


def _review(ex: Executor, job: Job) -> tuple[str, dict]:
    """A reviewed shot's approved take, decoded in full from its saved latents to the shot's own file (and
    its kept frames), the approval recorded in the sidecar; what runs downstream reads that file."""
    rv = ReviewJob.of(job.payload)
    if rv.approved is None:
        raise VidgenError(f"job #{job.id}: no take is approved; approve one (vidgen queue approve {job.id} TAKE)")
    shot, k = load_config(rv.config), rv.approved["take"]
    out, identity = Path(shot.output.path), {**job_identity(job, shot), "review": rv.approved}
    if resume.start_job(shot, out, identity).finished:     # an earlier attempt wrote it, then the worker died
        return str(out), {"reused": True, "take": k}
    o = shot.output
    result = decode_latents(latents_path(Path(rv.takes[k - 1]["output"])), callback=ex.progress, job=identity, overrides={
        "output.path": str(out), "output.decode": "full", "output.keep_frames": list(o.keep_frames),
        "output.overwrite": o.overwrite, "output.root": o.root, "output.save_latents": True})
    return str(result.path), {"take": k, "seed": result.seed, "num_frames": result.num_frames,
                              "timings": result.timings, "guard": result.guard}


def _stitch(ex: Executor, job: Job) -> tuple[str, dict]:
    out = run_stitch(job.payload, progress=lambda step, total: ex.progress(Progress("stitch", step, total)))
    return str(out), {}


def _contact_sheet(ex: Executor, job: Job) -> tuple[str, dict]:
    return str(run_contact_sheet(job.payload)), {}


KINDS: dict[str, Callable[[Executor, Job], tuple[str, dict]]] = {
    "render": _render, "stitch": _stitch, "contact_sheet": _contact_sheet, "review": _review,
}
"""Each of jobs.JOB_KINDS (the names the ledger accepts) and how it runs."""
