"""The queue's API: what `vidgen queue ...` (and any other front end) calls.

A submit plans the file (a workflow, or one render config) into jobs and runs every check a
worker would make before loading weights, so a job that would fail is refused before anything is
queued; the rest are the ledger's own operations under the names the CLI uses.

    from vidgen.queue import api
    ledger = api.open_ledger()                       # --db, $VIDGEN_QUEUE, or the default file
    ids = api.submit(ledger, "workflows/demo-shapes.yaml", ["sampling.steps=4"])
    api.jobs(ledger, "running")
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from ..paths import derived_paths, kept_frame_path
from .jobs import JOB_KINDS, Job, JobSpec, JobState
from .ledger import Ledger, default_path


def open_ledger(path: str | os.PathLike | None = None) -> Ledger:
    """The ledger at `path`, else $VIDGEN_QUEUE, else vidgen's file in the user's data directory."""
    return Ledger(path or default_path())


def plan(file: str | os.PathLike, overrides: list[str] | dict | None = None) -> list[JobSpec]:
    """The jobs a workflow file (or a single render config) becomes, validated; nothing is queued."""
    from .workflow import is_workflow, load_workflow, plan_jobs, plan_single

    if is_workflow(file):
        return plan_jobs(load_workflow(file, overrides))
    return plan_single(file, overrides)


def submit_specs(ledger: Ledger | str | os.PathLike | None, specs: Sequence[JobSpec]) -> list[int]:
    """Check `specs` as their workers would before loading weights (a blocked prompt raises
    GuardrailBlocked), then queue them in one transaction; returns their ids. `ledger` may be a
    path (None: the default one), opened only once the checks pass, so a refused submit creates
    no ledger file."""
    check_specs(specs)
    return (ledger if isinstance(ledger, Ledger) else open_ledger(ledger)).submit(specs)


def check_specs(specs: Sequence[JobSpec]) -> None:
    """Every check a job would run before loading weights, run now for a submit: render jobs get
    preflight (prompt filter, model folder JSON, image, every output file) without loading the
    guard's classifier; stitch and contact_sheet jobs check their output. Raises the first error
    (a blocked prompt is GuardrailBlocked, exit 3)."""
    from .steps import check_step

    infos: dict[str, object] = {}
    pending: dict[str, tuple] = {}      # what earlier jobs write for later ones: a kept frame's path -> its size;
                                        # a video's -> (width, height, frames), an Animate shot's performance
    for spec in specs:
        if spec.kind in ("render", "review"):      # a review job writes the shot's own file: a render's checks
            needs = _check_render(spec.payload if spec.kind == "render" else spec.payload["config"], infos, pending)
            spec.needs = needs if spec.kind == "render" else None      # a review job only decodes, in any budget
        elif spec.kind in JOB_KINDS:
            check_step(spec.kind, spec.payload)


def _check_render(payload: dict, infos: dict[str, object], pending: dict[str, tuple]) -> dict:
    """preflight's checks of one render job (`infos`: the model folders read so far, by model
    settings); the frames it keeps join `pending`, for the jobs after it that read them. Returns its
    memory needs (vidgen.queue.schedule): every way planned against no budget, for a GPU unless the
    config says cpu (a queued render runs where a worker has room)."""
    from dataclasses import replace

    from .. import memory, preflight, presets, sources  # torch and the model libraries: only once a render is checked
    from .schedule import needs_of

    cfg = presets.load_config(payload)
    key = repr(cfg.model)
    info = infos.get(key) or sources.inspect(cfg.model)
    infos[key] = info
    plan = preflight.check(cfg, info, pending=pending)       # weight-free: no guard classifier loaded
    pending.update({os.path.abspath(kept_frame_path(plan.output, k % plan.config.num_frames)):
                    (plan.config.width, plan.config.height) for k in plan.config.output.keep_frames})
    pending[os.path.abspath(plan.output)] = (plan.config.width, plan.config.height, plan.config.num_frames)
    device = "cpu" if cfg.model.device == "cpu" else "cuda"
    unbounded = replace(plan.config, memory=replace(plan.config.memory, device_budget=2**62, host_budget=2**62))
    return needs_of(memory.plan_render(unbounded, device=device, info=info, every=True), device)


def submit(ledger: Ledger | str | os.PathLike | None, file: str | os.PathLike,
           overrides: list[str] | dict | None = None) -> list[tuple[int, JobSpec]]:
    """Plan `file`, check every job and queue them: [(id, spec)] in order."""
    specs = plan(file, overrides)
    return list(zip(submit_specs(ledger, specs), specs))


def jobs(ledger: Ledger, state: JobState | str | None = None) -> list[Job]:
    return ledger.jobs(state)


def get(ledger: Ledger, job_id: int) -> Job:
    return ledger.get(job_id)


def cancel(ledger: Ledger, job_id: int) -> JobState:
    """Cancel a job: at once if it has not run, at its next step if it is running (the state returned)."""
    return ledger.cancel(job_id)


def pause(ledger: Ledger, job_id: int | None = None) -> None:
    """Pause a job (a running one at its next step, checkpointed), or with no id the whole queue."""
    ledger.pause(job_id)


def resume(ledger: Ledger, job_id: int | None = None) -> str:
    """Undo a pause; returns what it did (the job's new state, 'pause withdrawn', 'queue resumed')."""
    return ledger.resume(job_id)


def retry(ledger: Ledger, job_id: int) -> None:
    """Queue a failed, canceled or blocked job again, with its attempts reset. A finished one runs again
    too (a shot's review opens again), and every job after it, which started from what it made: their
    files are set aside first (`<name>.superseded-<time><ext>`, never deleted), so none is taken for done."""
    if ledger.get(job_id).state != JobState.SUCCEEDED:
        return ledger.retry(job_id)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for _, kind, state, output, payload in ledger.downstream(job_id):
        if output and state != JobState.RUNNING.value and kind in ("render", "review"):
            cfg = payload.get("config", payload)        # a review job's shot config, or the render's own
            keep, frames = (cfg.get("output") or {}).get("keep_frames") or [], cfg.get("num_frames") or 1
            for path in derived_paths(output, [k % frames for k in keep]).values():
                set_aside(path, stamp)
        elif output and state != JobState.RUNNING.value:
            set_aside(Path(output), stamp)
    ledger.reopen(job_id)


def set_aside(path: Path, stamp: str) -> None:
    """Rename `path` (if there) to `<stem>.superseded-<stamp><suffix>` beside it: kept, never taken for current."""
    if path.exists():
        path.rename(path.with_name(f"{path.stem}.superseded-{stamp}{path.suffix}"))


def approve(ledger: Ledger, job_id: int, take: int, by: str | None = None) -> None:
    """Approve take `take` of a shot awaiting review: its full decode runs, then what depends on the shot."""
    ledger.approve(job_id, take, by)


def reroll(ledger: Ledger, job_id: int, seed: int | None = None) -> int:
    """Add a take to a shot awaiting review (the next seed, or `seed`); returns the take's job id."""
    return ledger.reroll(job_id, seed)


def reject(ledger: Ledger, job_id: int, reason: str, by: str | None = None) -> None:
    """Reject a shot in review: it fails, and what depends on it fails with the reason."""
    ledger.reject(job_id, reason, by)


def logs(ledger: Ledger, job_id: int, attempt: int | None = None) -> list[tuple[int, float, str]]:
    """(attempt, time, text) of every log line of a job, or of one attempt."""
    return ledger.logs(job_id, attempt)
