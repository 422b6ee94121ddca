"""What a job is: its states, its failure kinds, the controls a worker obeys, the registered job
kinds, a job to submit (JobSpec, with its checks) and a job as stored (Job). No storage here: the
ledger (vidgen.queue.ledger) keeps them."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum

from pathlib import Path

from ..paths import C2PA_SIDECAR_TYPES, derived_paths


class JobState(str, Enum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"
    PAUSED = "paused"
    BLOCKED = "blocked-by-guard"
    WAITING = "waiting-on-deps"
    AWAITING_REVIEW = "awaiting_review"     # a shot's takes are rendered; a person approves one (vidgen.queue.review)


class FailureKind(str, Enum):
    """How a failed attempt is handled: config and guard are final, oom and other are retried."""
    CONFIG = "config"
    GUARD = "guard"
    OOM = "oom"
    OTHER = "other"


class Control(str, Enum):
    """What a heartbeat tells the worker to do next."""
    CONTINUE = "continue"
    CANCEL = "cancel"       # stop, then finish_canceled()
    PAUSE = "pause"         # stop (checkpoint first if possible), then release(paused=True)
    LOST = "lost"           # the lease is gone (expired and reclaimed): stop and write nothing


# The job kinds the executor runs (its KINDS); submit refuses any other, which could only fail at run time.
JOB_KINDS = ("render", "stitch", "contact_sheet", "review")

def _sqlite_int(value, low: int = -2**63) -> bool:
    """Whether `value` is an int (a bool is not one) from `low` up that an SQLite INTEGER holds (64-bit)."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value < 2**63


_ROLES = {"video": "output", "resume": "sampling checkpoint"}      # paths.derived_paths' roles, as said here


def written_files(kind: str, output: str) -> dict[str, str]:
    """Every file a job of `kind` with `output` writes, by what it is. A render writes its latents,
    sampling checkpoint, sidecar and preview beside the video (vidgen.paths.derived_paths, the one
    list of a render's names); the latents and checkpoint drop the extension, so `x.mp4`, `x.mkv`
    and the PNG folder `x` share them. A stitch writes its output and may write a timeline beside it
    (x.otio, x.edl, x.xml: counted whether asked or not, so two films named alike never race for one)
    and credentials (x.c2pa); a contact sheet writes only its output."""
    if kind == "stitch":
        film = Path(output)
        return {"output": output, **{f"timeline ({ext[1:]})": str(film.with_suffix(ext))
                                     for ext in (".otio", ".edl", ".xml")},
                **({"content credentials": str(film.with_suffix(".c2pa"))} if film.suffix.lower() in
                   C2PA_SIDECAR_TYPES else {})}
    if kind != "render":
        return {"output": output}
    return {_ROLES.get(role, role): str(path) for role, path in derived_paths(output).items()}


def _named(label: str, name: str) -> str:
    """'job 3 (name)', or just the label for a job without a name."""
    return f"{label} ({name})" if name else label


@dataclass
class JobSpec:
    """One job to submit. `deps`: indices into the list given to `Ledger.submit`, pointing at earlier
    entries (so no cycle); `after`: ids of jobs already in the ledger. It runs once all succeeded."""

    kind: str
    payload: dict
    name: str = ""
    priority: int = 0                   # higher runs first; ties run in submission order
    max_attempts: int = 3
    deps: list[int] = field(default_factory=list)
    after: list[int] = field(default_factory=list)
    output: str | None = None
    group: str | None = None            # a batch or workflow run, for listing
    needs: dict | None = None           # a render's memory needs, planned at submit (vidgen.queue.schedule)

    def problems(self, index: int) -> list[str]:
        """Everything wrong with this spec as entry `index` of a submission (submit checks that the
        `after` jobs exist and that no live job has the output)."""
        where, out = _named(f"job {index}", self.name), []
        if self.kind not in JOB_KINDS:
            out.append(f"{where}: kind must be one of {', '.join(JOB_KINDS)}, got {self.kind!r}")
        try:
            if not isinstance(self.payload, dict):
                raise TypeError(f"a dict is needed, got {type(self.payload).__name__}")
            json.dumps(self.payload)
        except (TypeError, ValueError) as e:
            out.append(f"{where}: payload must be a JSON-serialisable dict ({e})")
        if not _sqlite_int(self.priority):
            out.append(f"{where}: priority must be an int from {-2**63} to {2**63 - 1}, got {self.priority!r}")
        if not _sqlite_int(self.max_attempts, low=1):
            out.append(f"{where}: max_attempts must be an int from 1 to {2**63 - 1}, got {self.max_attempts!r}")
        out += [f"{where}: deps index {d!r} must point at an earlier job (0..{index - 1})" for d in self.deps
                if not _sqlite_int(d) or not 0 <= d < index]
        out += [f"{where}: after entry {a!r} must be a job id (an int)" for a in self.after if not _sqlite_int(a)]
        if self.output is not None and not (isinstance(self.output, str) and self.output):
            out.append(f"{where}: output must be a non-empty path string or None, got {self.output!r}")
        return out


@dataclass
class Job:
    """A job as stored. `attempts` counts against `max_attempts` (retry resets it, release gives one
    back); `attempt` numbers the latest attempt and never goes back, so logs stay apart."""

    id: int
    kind: str
    name: str
    payload: dict
    priority: int
    state: JobState
    attempts: int
    max_attempts: int
    run_after: float
    lease_owner: str | None
    lease_expires: float | None
    progress: dict                      # step, total, stage, eta_s, updated (+ what the worker adds)
    checkpoint: str | None
    output: str | None
    error: str | None
    group: str | None
    created: float
    started: float | None
    finished: float | None
    attempt: int = 0
    failure_kind: FailureKind | None = None
    failed_dep: int | None = None       # the dependency whose failure failed this job
    request: Control | None = None      # cancel / pause asked of the running worker
    result: dict | None = None
    deps: list[int] = field(default_factory=list)
    needs: dict | None = None           # what a render needs of a worker's memory (vidgen.queue.schedule)

    def to_dict(self) -> dict:
        """Plain JSON-ready dict (enums as their values)."""
        return {key: value.value if isinstance(value, Enum) else value for key, value in asdict(self).items()}


def output_clashes(live: Sequence[Sequence], specs: Sequence[JobSpec], where: str | None = None) -> list[str]:
    """Files of `specs` that a live job ((id, kind, name, state, output) rows) or a job earlier in
    `specs` will also write: the outputs, and every file derived from them (written_files: `x.mp4`
    and `x.mkv` share `x.latents.safetensors`), which the two would overwrite. Paths are compared
    after abspath() (an API caller may have stored a relative one). Each problem starts with `where`
    (default: "job I (name)")."""
    holders: dict[str, tuple[str, str, int | None]] = {}    # file -> (holder's description, its output, id)
    for job_id, kind, name, state, output in live:
        holder = f"{_named(f'job #{job_id}', name)}, which is {state}"
        for file in written_files(kind, output).values():
            holders.setdefault(os.path.abspath(file), (holder, os.path.abspath(output), job_id))
    out = []
    for i, spec in enumerate(specs):
        if not (isinstance(spec.output, str) and spec.output):
            continue                                    # no output, or a bad one that problems() reports
        path, label = os.path.abspath(spec.output), where or _named(f"job {i}", spec.name)
        files = {what: os.path.abspath(f) for what, f in written_files(spec.kind, spec.output).items()}
        clash = next(((what, f, holders[f]) for what, f in files.items() if f in holders), None)
        if clash is None:
            for f in files.values():
                holders[f] = (f"{label} of this submission", path, None)
            continue
        what, file, (holder, theirs, job_id) = clash
        if job_id is None:
            fix = "give each job its own output path" if theirs == path else "give each job its own output name"
        else:
            fix = f"choose another output {'path' if theirs == path else 'name'} or cancel #{job_id}"
        if theirs == path:
            again = "also" if job_id is None else "already"
            out.append(f"{label}: output {path} is {again} the output of {holder}; {fix}")
        else:
            out.append(f"{label}: output {path} and {theirs}, the output of {holder}, both write {file} "
                       f"(the {what}); {fix}")
    return out
