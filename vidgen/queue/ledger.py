"""The job ledger: the queue's storage, one SQLite file that is the source of truth for every job.

A worker claims a job by taking a lease (owner, expiry) in one short transaction and renews it by
heartbeats. When a worker dies its lease expires and the next claim, by any worker, takes the job
back: at-least-once delivery, made safe by idempotent outputs (`*.partial`, then `os.replace`). Each
method names the transitions it makes; a job that ends failed, blocked or canceled fails its
not-yet-run dependents, transitively, and retrying it restores them.

SQLite: WAL, so readers never block the writer; autocommit connections and an explicit `BEGIN
IMMEDIATE` around every read-then-write, so two claimers never read the same queued row (a deferred
transaction takes the write lock late and fails with SQLITE_BUSY instead of waiting); `busy_timeout`,
so writers queue for the lock; `synchronous=FULL`, so a committed submit survives a power cut.

The ledger must be on a local disk: WAL coordinates processes through shared memory
(`queue.db-shm`) that network filesystems (NFS, SMB, sshfs, ...) do not share between hosts, which
corrupts the database. The ledger refuses such a path; keep it local ($VIDGEN_QUEUE) and put only
outputs on shared storage.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from ..errors import InputError
from .file_errors import DAMAGED, ELSEWHERE, NETWORK_FS, file_error_fix, filesystem
from .jobs import Control, FailureKind, Job, JobSpec, JobState, _sqlite_int, output_clashes
from .review import Reviews
from .schedule import SCHEMA_V2, Scheduling, WorkerFacts

SCHEMA_VERSION = 2

_NOT_RUN = (JobState.QUEUED.value, JobState.WAITING.value, JobState.PAUSED.value, JobState.AWAITING_REVIEW.value)
_LIVE = (*_NOT_RUN, JobState.RUNNING.value)     # jobs that will still write their output
_FINAL_BAD = (JobState.FAILED.value, JobState.CANCELED.value, JobState.BLOCKED.value)
_UNLEASED = {"lease_owner": None, "lease_expires": None, "request": None}

# Version 1. JSON: payload, progress, result. rate_t0/rate_step0: where the step rate behind eta_s is
# measured from. meta holds 'paused' (the whole queue). Job explains the other columns.
_SCHEMA = """
CREATE TABLE jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,   -- never reused, so an old id never names a new job
    kind TEXT NOT NULL, name TEXT NOT NULL DEFAULT '', payload TEXT NOT NULL, priority INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, max_attempts INTEGER NOT NULL DEFAULT 3,
    attempt INTEGER NOT NULL DEFAULT 0, run_after REAL NOT NULL DEFAULT 0, lease_owner TEXT, lease_expires REAL,
    request TEXT, progress TEXT NOT NULL DEFAULT '{}', rate_t0 REAL, rate_step0 REAL, checkpoint TEXT, output TEXT,
    result TEXT, error TEXT, failure_kind TEXT, failed_dep INTEGER, grp TEXT, created REAL NOT NULL, started REAL,
    finished REAL);
CREATE INDEX jobs_claim ON jobs(state, priority DESC, id);
CREATE INDEX jobs_lease ON jobs(state, lease_expires);
CREATE INDEX jobs_group ON jobs(grp);
CREATE TABLE deps (job INTEGER NOT NULL REFERENCES jobs(id), dep INTEGER NOT NULL REFERENCES jobs(id),
    PRIMARY KEY (job, dep)) WITHOUT ROWID;
CREATE INDEX deps_dep ON deps(dep, job);
CREATE TABLE attempts (job INTEGER NOT NULL REFERENCES jobs(id), attempt INTEGER NOT NULL,
    owner TEXT NOT NULL, started REAL NOT NULL, finished REAL, outcome TEXT,
    PRIMARY KEY (job, attempt)) WITHOUT ROWID;
CREATE TABLE logs (id INTEGER PRIMARY KEY, job INTEGER NOT NULL REFERENCES jobs(id),
    attempt INTEGER NOT NULL, time REAL NOT NULL, text TEXT NOT NULL);
CREATE INDEX logs_job ON logs(job, attempt, id);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)
"""
_SELECT_JOB = "SELECT *, (SELECT group_concat(dep) FROM deps WHERE job = jobs.id) AS dep_ids FROM jobs"


def default_path() -> Path:
    """$VIDGEN_QUEUE, else <XDG_DATA_HOME or ~/.local/share>/vidgen/queue.db."""
    if os.environ.get("VIDGEN_QUEUE"):
        return Path(os.environ["VIDGEN_QUEUE"]).expanduser()
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "vidgen" / "queue.db"


def _merge(base: dict, patch: dict) -> dict:
    """`base` with `patch` merged in, nested dicts merged key by key."""
    out = dict(base)
    for key, value in patch.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _job(row: sqlite3.Row) -> Job:
    """A Job from a row of _SELECT_JOB."""
    d = dict(row)
    del d["rate_t0"], d["rate_step0"]
    deps = sorted(int(i) for i in (d.pop("dep_ids") or "").split(",") if i)
    d.update(payload=json.loads(d["payload"]), progress=json.loads(d["progress"]), state=JobState(d["state"]),
             needs=json.loads(d["needs"]) if d.get("needs") else None,
             group=d.pop("grp"), result=json.loads(d["result"]) if d["result"] else None, deps=deps,
             failure_kind=d["failure_kind"] and FailureKind(d["failure_kind"]),
             request=d["request"] and Control(d["request"]))
    return Job(**d)


class Ledger(Reviews, Scheduling):
    """The job ledger in one SQLite file on a local disk. One connection per Ledger, behind a lock, so
    a worker thread and its heartbeat thread can share one; each process opens its own.

    Args:
        path: the database file; created, with its folder, if missing.
        backoff_s: retry delay after the first `other` failure; doubles with each attempt.
        backoff_max_s: cap on that delay.
        clock: seconds since the epoch; tests pass a fake one.
        busy_timeout_s: how long a write waits for another process's transaction.
    """

    def __init__(self, path: str | os.PathLike, *, backoff_s: float = 5.0, backoff_max_s: float = 3600.0,
                 clock: Callable[[], float] = time.time, busy_timeout_s: float = 30.0):
        self.path = Path(path).expanduser()
        self.backoff_s, self.backoff_max_s = backoff_s, backoff_max_s
        self._clock, self._busy_timeout_s = clock, busy_timeout_s
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            why = "a file is in the way" if isinstance(e, (FileExistsError, NotADirectoryError)) else e.strerror
            raise self._unusable(f"cannot create its folder {e.filename or self.path.parent}: {why}") from e
        if (fstype := filesystem(self.path.parent)) in NETWORK_FS:
            raise InputError(f"the queue ledger {self.path} is on a network filesystem ({fstype}); SQLite's "
                             "WAL mode needs a local disk: set VIDGEN_QUEUE to a local path")
        self._lock, self._db, self._pid = threading.RLock(), None, -1     # _db: opened by _conn()
        try:
            with self._tx() as db:
                version = db.execute("PRAGMA user_version").fetchone()[0]
                if version > SCHEMA_VERSION:
                    raise InputError(f"the queue ledger {self.path} has schema version {version}, newer than this "
                                     f"vidgen reads ({SCHEMA_VERSION}); upgrade vidgen")
                if version < SCHEMA_VERSION:    # a new ledger, or version 1's brought to 2 (needs, workers)
                    for statement in (_SCHEMA.split(";") if version == 0 else []) + list(SCHEMA_V2):
                        db.execute(statement)
                    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except BaseException:
            self.close()        # nobody gets this object to close; SQLite then removes its -wal and -shm
            raise

    def _unusable(self, reason: str, fix: str = ELSEWHERE) -> InputError:
        return InputError(f"cannot use the queue ledger {self.path}: {reason}; {fix}")

    def _conn(self) -> sqlite3.Connection:
        # Not across fork(): a child opens its own, leaving the inherited one (and the parent's locks) alone.
        if self._db is None or self._pid != os.getpid():
            db = sqlite3.connect(self.path, timeout=self._busy_timeout_s, isolation_level=None,
                                 check_same_thread=False)
            try:
                db.row_factory = sqlite3.Row
                db.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_s * 1000)}")
                # Before the first write (WAL mode below rewrites the header): another program's database
                # (tables, but no schema version of ours) is not ours to change.
                if db.execute("PRAGMA user_version").fetchone()[0] == 0 and (other := db.execute(
                        "SELECT name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' LIMIT 1").fetchone()):
                    raise self._unusable(f"it is an SQLite database of something else (it has a table {other[0]!r}),"
                                         " not a vidgen queue ledger")
                if (mode := db.execute("PRAGMA journal_mode = WAL").fetchone()[0]) != "wal":
                    raise self._unusable(f"SQLite WAL mode is not available there (journal mode {mode!r})",
                                         "put it on a local disk")
                db.execute("PRAGMA synchronous = FULL")
                db.execute("PRAGMA foreign_keys = ON")
            except BaseException:
                db.close()
                raise
            self._db, self._pid = db, os.getpid()
        return self._db

    @contextmanager
    def _use(self) -> Iterator[sqlite3.Connection]:
        """The connection, held under the lock: the one way in, so that an error of the file itself
        (unreadable, damaged, read-only, disk full) becomes one InputError saying what to do."""
        with self._lock:
            try:
                yield self._conn()
            except sqlite3.DatabaseError as e:
                if (fix := file_error_fix(e)) is None:
                    raise                       # our own SQL is wrong: a bug, with its traceback
                self.close()                    # the next call starts afresh; SQLite removes its -wal and -shm
                raise self._unusable("it is a folder" if self.path.is_dir() else str(e), fix) from e

    @contextmanager
    def _tx(self, write: bool = True) -> Iterator[sqlite3.Connection]:
        """One transaction: BEGIN IMMEDIATE for writes, one consistent snapshot for multi-query reads."""
        with self._use() as db:
            db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:           # SQLite has rolled back already after some errors (I/O, full)
                    db.execute("ROLLBACK")
                raise

    def close(self) -> None:
        with self._lock:
            if self._db is not None and self._pid == os.getpid():
                self._db.close()
            self._db = None

    def __del__(self) -> None:
        # A Ledger dropped unclosed (the CLI's) closes now: a sqlite3 connection sits in a reference
        # cycle, so it would stay open, its -wal and -shm files beside the ledger, until a gc run.
        if getattr(self, "_db", None) is not None:
            self.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _no_job(self, job_id) -> InputError:
        return InputError(f"no job #{job_id} in {self.path}")

    def _id(self, job_id) -> int:
        """`job_id` if it can name a job (an int SQLite holds); an id beyond 64 bits names none."""
        if not _sqlite_int(job_id):
            raise self._no_job(job_id)
        return job_id

    def _row(self, db: sqlite3.Connection, job_id: int) -> sqlite3.Row:
        if (row := db.execute("SELECT * FROM jobs WHERE id = ?", (self._id(job_id),)).fetchone()) is None:
            raise self._no_job(job_id)
        return row

    @staticmethod
    def _set(db: sqlite3.Connection, job_id: int, **cols) -> None:      # column names are ours, never input
        db.execute(f"UPDATE jobs SET {', '.join(f'{c} = ?' for c in cols)} WHERE id = ?", (*cols.values(), job_id))

    @staticmethod
    def _holds(row: sqlite3.Row, owner: str) -> bool:
        # An expired lease nobody has taken back yet is still its owner's: no one else ran the job.
        return row["state"] == JobState.RUNNING.value and row["lease_owner"] == owner

    @staticmethod
    def _related(db: sqlite3.Connection, job_id: int, *, parents: bool, states: Sequence[str] = ()) -> list:
        """(id, state) of the job's dependencies (parents) or dependents, optionally only in `states`."""
        near, far = ("job", "dep") if parents else ("dep", "job")
        where = f" AND j.state IN ({','.join('?' * len(states))})" if states else ""
        return db.execute(f"SELECT j.id, j.state FROM deps d JOIN jobs j ON j.id = d.{far} WHERE d.{near} = ?"
                          f"{where} ORDER BY j.id", (job_id, *states)).fetchall()

    @staticmethod
    def _end_attempt(db: sqlite3.Connection, job_id: int, outcome: str, now: float) -> None:
        db.execute("UPDATE attempts SET finished = ?, outcome = ? WHERE job = ? AND finished IS NULL "
                   "AND attempt = (SELECT attempt FROM jobs WHERE id = ?)", (now, outcome, job_id, job_id))

    @staticmethod
    def _append_log(db: sqlite3.Connection, job_id: int, now: float, text: str) -> int:
        return db.execute("INSERT INTO logs (job, attempt, time, text) SELECT id, attempt, ?, ? FROM jobs "
                          "WHERE id = ?", (now, text, job_id)).rowcount

    def _finish(self, db: sqlite3.Connection, job_id: int, state: JobState, now: float, *,
                error: str | None = None, kind: FailureKind | None = None) -> JobState:
        """End a job in a final state; a bad ending fails its not-yet-run dependents."""
        self._set(db, job_id, state=state.value, finished=now, error=error, failure_kind=kind and kind.value,
                  **_UNLEASED)
        if state.value in _FINAL_BAD:
            self._fail_dependents(db, job_id, now)
        return state

    def _requeue(self, db: sqlite3.Connection, row: sqlite3.Row, now: float, *, delay: float = 0.0,
                 paused: bool = False, **cols) -> JobState:
        """Take a running job back: canceled if that was asked, else paused or queued after `delay`."""
        if row["request"] == Control.CANCEL.value:
            return self._finish(db, row["id"], JobState.CANCELED, now)
        state = JobState.PAUSED if paused or row["request"] == Control.PAUSE.value else JobState.QUEUED
        self._set(db, row["id"], state=state.value, run_after=now + delay, **_UNLEASED, **cols)
        return state

    def _fail_dependents(self, db: sqlite3.Connection, job_id: int, now: float, only: int | None = None) -> None:
        """Fail the not-yet-run dependents (or only `only`) of a job that ended badly, transitively."""
        kids = [(only, None)] if only is not None else self._related(db, job_id, parents=False, states=_NOT_RUN)
        todo = [(child, job_id) for child, _ in kids]
        while todo:
            child, parent_id = todo.pop()
            if self._row(db, child)["state"] not in _NOT_RUN:
                continue                                    # reached twice, through a diamond
            parent = self._row(db, parent_id)
            reason = f"dependency #{parent_id} {parent['state']}" + (f": {parent['error']}" if parent["error"] else "")
            self._set(db, child, state=JobState.FAILED.value, error=reason, failure_kind=None, failed_dep=parent_id,
                      finished=now)
            todo += [(r[0], child) for r in self._related(db, child, parents=False, states=_NOT_RUN)]

    def _settle(self, db: sqlite3.Connection, job_id: int, now: float) -> JobState:
        """Put a job that has not run yet where its dependencies say: queued, waiting, or failed."""
        deps = self._related(db, job_id, parents=True)
        if (bad := next((d[0] for d in deps if d[1] in _FINAL_BAD), None)) is not None:
            self._set(db, job_id, state=JobState.WAITING.value)
            self._fail_dependents(db, bad, now, only=job_id)
            return JobState.FAILED
        state = JobState.QUEUED if all(d[1] == JobState.SUCCEEDED.value for d in deps) else JobState.WAITING
        state = JobState.AWAITING_REVIEW if state is JobState.QUEUED and self._gated(db, job_id) else state
        self._set(db, job_id, state=state.value, run_after=now, error=None, failure_kind=None, failed_dep=None,
                  finished=None)
        return state

    def submit(self, specs: Sequence[JobSpec]) -> list[int]:
        """Add jobs in one transaction; returns their ids in order. Every problem is reported at once."""
        problems = [p for i, spec in enumerate(specs) for p in spec.problems(i)]
        now = self._clock()
        with self._tx() as db:
            problems += [f"job {i}: after names job #{job_id}, which is not in {self.path}"
                         for i, spec in enumerate(specs) for job_id in spec.after if _sqlite_int(job_id)
                         and db.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone() is None]
            problems += self._output_clashes(db, specs)
            if problems:
                raise InputError("cannot submit: " + "; ".join(problems))
            ids: list[int] = []
            for spec in specs:
                ids.append(self._insert(db, spec, sorted({ids[d] for d in spec.deps} | set(spec.after)), now))
            for job_id in ids:
                self._settle(db, job_id, now)
        return ids

    @staticmethod
    def _insert(db: sqlite3.Connection, spec: JobSpec, deps: list[int], now: float) -> int:
        """One checked spec stored, waiting on the job ids `deps` (the caller settles it); its id."""
        job_id = db.execute(
            "INSERT INTO jobs (kind, name, payload, priority, state, max_attempts, run_after, output, grp, "
            "created, needs) VALUES (?, ?, ?, ?, 'waiting-on-deps', ?, ?, ?, ?, ?, ?)",
            (spec.kind, spec.name, json.dumps(spec.payload), spec.priority, spec.max_attempts, now,
             spec.output, spec.group, now, spec.needs and json.dumps(spec.needs))).lastrowid
        db.executemany("INSERT INTO deps (job, dep) VALUES (?, ?)", [(job_id, d) for d in deps])
        return job_id

    @staticmethod
    def _output_clashes(db: sqlite3.Connection, specs: Sequence[JobSpec], exclude: int | None = None,
                       where: str | None = None) -> list[str]:
        """jobs.output_clashes of `specs` against the live jobs (but `exclude`). Run in the transaction
        of the write, so two submits cannot both take a path. A plain query, no index: live jobs are
        few and found by the state index."""
        live = [row for row in db.execute(f"SELECT id, kind, name, state, output FROM jobs WHERE state IN "
                                          f"({','.join('?' * len(_LIVE))}) AND output IS NOT NULL", _LIVE)
                if row["id"] != exclude]
        return output_clashes(live, specs, where)

    def claim(self, owner: str, lease_s: float = 60, kinds: Sequence[str] | None = None, devices: int = 1,
              worker: WorkerFacts | None = None) -> Job | None:
        """Lease the best runnable job (highest priority, then oldest) to `owner`; None if there is none
        or the queue is paused. Takes back expired leases first, so a dead worker's job runs again.
        A render asking for more devices (parallel.devices) than the worker's `devices` is left alone, and
        with `worker` (what it has, now recorded as live) one whose memory needs fit no way (schedule)."""
        now = self._clock()
        with self._tx() as db:
            if worker is not None:
                self._seen(db, owner, worker, now)
            for row in db.execute("SELECT * FROM jobs WHERE state = 'running' AND lease_expires < ?", [now]).fetchall():
                self._end_attempt(db, row["id"], "lost", now)
                self._append_log(db, row["id"], now, f"lease of {row['lease_owner']} expired")
                error = "lease expired (worker died?)"
                if row["attempts"] >= row["max_attempts"] and row["request"] != Control.CANCEL.value:
                    self._finish(db, row["id"], JobState.FAILED, now, error=error, kind=FailureKind.OTHER)
                else:
                    self._requeue(db, row, now, error=error)
            if db.execute("SELECT 1 FROM meta WHERE key = 'paused'").fetchone():
                return None
            where = "state = 'queued' AND run_after <= ? AND COALESCE(json_extract(payload, '$.parallel.devices'), 1) <= ?"
            args = [now, devices]
            if kinds is not None:
                where, args = where + f" AND kind IN ({','.join('?' * len(kinds))})", args + list(kinds)
            rows = db.execute(f"SELECT id, priority, needs FROM jobs WHERE {where} ORDER BY priority DESC, id"
                              + ("" if worker else " LIMIT 1"), args).fetchall()
            if (row := self._pick(db, rows, worker, owner, now)) is None:
                return None
            db.execute("UPDATE jobs SET state = 'running', lease_owner = ?, lease_expires = ?, started = ?, "
                       "attempts = attempts + 1, attempt = attempt + 1, finished = NULL, request = NULL, "
                       "progress = '{}', rate_t0 = NULL, rate_step0 = NULL WHERE id = ?",
                       (owner, now + lease_s, now, row["id"]))
            db.execute("INSERT INTO attempts (job, attempt, owner, started) SELECT id, attempt, ?, ? FROM jobs "
                       "WHERE id = ?", (owner, now, row["id"]))
            return _job(db.execute(f"{_SELECT_JOB} WHERE id = ?", (row["id"],)).fetchone())

    def heartbeat(self, job_id: int, owner: str, lease_s: float = 60, progress: dict | None = None,
                  checkpoint: str | None = None) -> Control:
        """Renew `owner`'s lease, store progress and checkpoint, and say whether to go on. `progress` is
        merged in; with `step` and `total`, `eta_s` comes from the step rate of this attempt and stage."""
        now = self._clock()
        with self._tx() as db:
            row = self._row(db, job_id)
            if not self._holds(row, owner):
                return Control.LOST
            cols: dict = {"lease_expires": now + lease_s}
            if progress is not None:
                merged, t0, step0 = self._progress(row, progress, now)
                cols.update(progress=json.dumps(merged), rate_t0=t0, rate_step0=step0)
            if checkpoint is not None:
                cols["checkpoint"] = checkpoint
            self._set(db, job_id, **cols)
            return Control(row["request"]) if row["request"] else Control.CONTINUE

    @staticmethod
    def _progress(row: sqlite3.Row, update: dict, now: float) -> tuple[dict, float | None, float | None]:
        old = json.loads(row["progress"])
        new = {**old, **update, "updated": now}
        step, total, t0, step0 = new.get("step"), new.get("total"), row["rate_t0"], row["rate_step0"]
        # The rate restarts with a new stage (denoise -> decode) or total, or a step count that went back.
        if step is not None and (step0 is None or step < step0 or new.get("stage") != old.get("stage")
                                 or total != old.get("total")):
            t0, step0 = now, step
        if "eta_s" not in update:
            known = None not in (step, total, step0) and step > step0 and now > t0
            new["eta_s"] = max(0.0, (total - step) * (now - t0) / (step - step0)) if known else None
        return new, t0, step0

    def complete(self, job_id: int, owner: str, output: str | None = None, result: dict | None = None) -> bool:
        """Mark the job succeeded and queue the dependents it was the last to hold up. False, changing
        nothing, when `owner` lost the lease: the worker that has the job now is the one that counts."""
        now = self._clock()
        with self._tx() as db:
            if not self._holds(row := self._row(db, job_id), owner):
                return False
            self._end_attempt(db, job_id, "succeeded", now)
            self._set(db, job_id, output=output if output is not None else row["output"],
                      result=json.dumps(result) if result is not None else None,
                      progress=json.dumps({**json.loads(row["progress"]), "eta_s": 0.0, "updated": now}))
            self._finish(db, job_id, JobState.SUCCEEDED, now)
            for child, _ in self._related(db, job_id, parents=False, states=[JobState.WAITING.value]):
                self._settle(db, child, now)
            return True

    def fail(self, job_id: int, owner: str, error: str, kind: FailureKind | str,
             payload_patch: dict | None = None) -> JobState:
        """Record a failed attempt; returns the new state. config -> failed, guard -> blocked-by-guard;
        oom -> queued at once with `payload_patch` (lower-memory settings) merged into the payload;
        other -> queued after backoff_s * 2**(attempts-1) (<= backoff_max_s); out of attempts -> failed.
        A pending cancel/pause wins over a retry. Without the lease: no change, the current state."""
        kind, now = FailureKind(kind), self._clock()
        with self._tx() as db:
            if not self._holds(row := self._row(db, job_id), owner):
                return JobState(row["state"])
            self._end_attempt(db, job_id, kind.value, now)
            self._append_log(db, job_id, now, f"failed ({kind.value}): {error}")
            if kind in (FailureKind.CONFIG, FailureKind.GUARD):
                state = JobState.FAILED if kind is FailureKind.CONFIG else JobState.BLOCKED
                return self._finish(db, job_id, state, now, error=error, kind=kind)
            if row["attempts"] >= row["max_attempts"] and row["request"] != Control.CANCEL.value:
                error = f"{error} (gave up after {row['attempts']} attempts)"
                return self._finish(db, job_id, JobState.FAILED, now, error=error, kind=kind)
            delay = 0.0 if kind is FailureKind.OOM else self.backoff_s * 2 ** (row["attempts"] - 1)
            payload = _merge(json.loads(row["payload"]), payload_patch or {})
            return self._requeue(db, row, now, delay=min(delay, self.backoff_max_s), payload=json.dumps(payload),
                                 error=error, failure_kind=kind.value)

    def release(self, job_id: int, owner: str, *, paused: bool = False) -> None:
        """Give a running job back without counting the attempt (graceful shutdown, or pause); the
        checkpoint stays for the next attempt. Nothing happens if `owner` lost the lease."""
        now = self._clock()
        with self._tx() as db:
            if self._holds(row := self._row(db, job_id), owner):
                paused = paused or row["request"] == Control.PAUSE.value
                outcome = "canceled" if row["request"] == Control.CANCEL.value else "paused" if paused else "released"
                self._end_attempt(db, job_id, outcome, now)
                self._requeue(db, row, now, paused=paused, attempts=max(row["attempts"] - 1, 0))

    def finish_canceled(self, job_id: int, owner: str) -> None:
        """The worker stopped a running job after a cancel request; nothing if it lost the lease."""
        now = self._clock()
        with self._tx() as db:
            if self._holds(self._row(db, job_id), owner):
                self._end_attempt(db, job_id, "canceled", now)
                self._finish(db, job_id, JobState.CANCELED, now)

    def cancel(self, job_id: int) -> JobState:
        """Cancel a job that has not started at once (its dependents fail); a running job gets a
        request its worker sees on the next heartbeat. Returns the state after the call."""
        now = self._clock()
        with self._tx() as db:
            state = self._row(db, job_id)["state"]
            if state in _NOT_RUN:
                return self._finish(db, job_id, JobState.CANCELED, now)
            if state == JobState.RUNNING.value:
                self._set(db, job_id, request=Control.CANCEL.value)
            elif state != JobState.CANCELED.value:
                raise InputError(f"job #{job_id} is {state}; only queued, waiting, paused or running jobs can be "
                                 "canceled")
            return JobState(state)

    def pause(self, job_id: int | None = None) -> None:
        """Pause one job (queued or waiting -> paused; running -> a request seen by heartbeat), or,
        with no id, the whole queue: claim returns None until resume(); running jobs go on."""
        with self._tx() as db:
            if job_id is None:
                db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('paused', '1')")
                return
            row = self._row(db, job_id)
            if row["state"] in (JobState.QUEUED.value, JobState.WAITING.value):
                self._set(db, job_id, state=JobState.PAUSED.value)
            elif row["state"] == JobState.RUNNING.value:     # a cancel request stays a cancel
                self._set(db, job_id, request=row["request"] or Control.PAUSE.value)
            elif row["state"] != JobState.PAUSED.value:
                raise InputError(f"job #{job_id} is {row['state']}; only queued, waiting or running jobs can be paused")

    def resume(self, job_id: int | None = None) -> str:
        """Undo pause() and say what changed: a paused job goes back to queued or waiting (returns that
        state), a pause request its worker has not seen yet is withdrawn ('pause withdrawn'); with no
        id, the whole queue runs again ('queue resumed'). A job with no pause to undo is refused."""
        now = self._clock()
        with self._tx() as db:
            if job_id is None:
                db.execute("DELETE FROM meta WHERE key = 'paused'")
                return "queue resumed"
            row = self._row(db, job_id)
            if row["state"] == JobState.PAUSED.value:
                return self._settle(db, job_id, now).value
            if row["state"] == JobState.RUNNING.value and row["request"] == Control.PAUSE.value:
                self._set(db, job_id, request=None)
                return "pause withdrawn"
            if row["state"] in _LIVE:
                raise InputError(f"job #{job_id} is {row['state']}, not paused; nothing to resume")
            raise InputError(f"job #{job_id} is {row['state']}; only paused jobs can be resumed "
                             "(failed, canceled or blocked jobs are retried)")

    def retry(self, job_id: int) -> None:
        """Run a failed, canceled or blocked job again with its attempts reset; the dependents its
        failure failed go back to waiting."""
        now = self._clock()
        with self._tx() as db:
            if (state := self._row(db, job_id)["state"]) not in _FINAL_BAD:
                raise InputError(f"job #{job_id} is {state}; only failed, canceled or blocked jobs can be retried")
            for dep, dep_state in self._related(db, job_id, parents=True, states=_FINAL_BAD)[:1]:
                raise InputError(f"job #{job_id} depends on job #{dep}, which is {dep_state}; retry #{dep} first")
            todo = [job_id]
            while todo:
                jid = todo.pop()
                self._set(db, jid, attempts=0, **_UNLEASED)
                if self._settle(db, jid, now) is not JobState.FAILED:
                    todo += [r[0] for r in db.execute("SELECT id FROM jobs WHERE failed_dep = ? AND state = 'failed'",
                                                      (jid,)).fetchall()]

    def update(self, job_id: int, *, priority: int | None = None, payload: dict | None = None, output: str | None = None) -> None:
        """A new priority for a job not finished (reorders the queue), a new payload (and output) for one not started."""
        with self._tx() as db:
            state, attempts = (row := self._row(db, job_id))["state"], row["attempts"]
            if payload is not None and (state not in _NOT_RUN or attempts):
                raise InputError(f"job #{job_id} is {state}; only a job that has not started can be edited")
            if output is not None and (clash := self._output_clashes(
                    db, [JobSpec(row["kind"], {}, row["name"], output=output)], exclude=job_id,
                    where=f"cannot edit job #{job_id}")):
                raise InputError(clash[0])
            if priority is not None and state not in _LIVE:
                raise InputError(f"job #{job_id} is {state}; only a job that has not finished can be reordered")
            cols = {"priority": priority, "payload": None if payload is None else json.dumps(payload), "output": output}
            if cols := {k: v for k, v in cols.items() if v is not None}:
                self._set(db, job_id, **cols)

    def history(self, job_id: int) -> list[dict]:
        """A job's attempts: number, worker, start, end, outcome."""
        with self._use() as db:
            rows = db.execute("SELECT * FROM attempts WHERE job = ? ORDER BY attempt", (self._id(job_id),)).fetchall()
        return [{k: r[k] for k in ("attempt", "owner", "started", "finished", "outcome")} for r in rows]

    def get(self, job_id: int) -> Job:
        with self._use() as db:
            row = db.execute(f"{_SELECT_JOB} WHERE id = ?", (self._id(job_id),)).fetchone()
        if row is None:
            raise self._no_job(job_id)
        return _job(row)

    def jobs(self, state: JobState | str | None = None, group: str | None = None) -> list[Job]:
        """Jobs in id order, optionally only those in `state` and/or `group`."""
        if state is not None and state not in {s.value for s in JobState}:
            raise InputError(f"unknown job state {state!r}; allowed: {', '.join(s.value for s in JobState)}")
        sql = f"{_SELECT_JOB} WHERE state = COALESCE(?, state) AND grp IS COALESCE(?, grp) ORDER BY id"
        with self._use() as db:
            rows = db.execute(sql, (state and JobState(state).value, group)).fetchall()
        return [_job(r) for r in rows]

    def has_unfinished(self) -> bool:
        """Whether any job is queued or running (one read). A job waiting on its dependencies then waits on
        a paused job or a shot awaiting review: on a person, not on a worker."""
        with self._use() as db:
            return db.execute("SELECT 1 FROM jobs WHERE state IN ('queued', 'running') LIMIT 1").fetchone() is not None

    def is_paused(self) -> bool:
        with self._use() as db:
            return db.execute("SELECT 1 FROM meta WHERE key = 'paused'").fetchone() is not None

    def log(self, job_id: int, text: str) -> None:
        """Append a line to the log of the job's current attempt (attempt 0 before the first claim)."""
        with self._use() as db:
            if self._append_log(db, self._id(job_id), self._clock(), text) == 0:
                raise self._no_job(job_id)

    def logs(self, job_id: int, attempt: int | None = None) -> list[tuple[int, float, str]]:
        """(attempt, time, text) of every log line of the job, or of one attempt, oldest first."""
        with self._tx(write=False) as db:
            self._row(db, job_id)
            return [tuple(r) for r in db.execute("SELECT attempt, time, text FROM logs WHERE job = ? AND "
                                                 "attempt = COALESCE(?, attempt) ORDER BY id", (job_id, attempt))]

    def integrity_check(self) -> str:
        """'ok', or SQLite's list of problems joined with '; '."""
        with self._use() as db:
            try:
                return "; ".join(r[0] for r in db.execute("PRAGMA integrity_check").fetchall())
            except sqlite3.DatabaseError as e:
                if file_error_fix(e) is not DAMAGED:
                    raise
                return str(e)           # too damaged for SQLite to walk it: that is the finding
