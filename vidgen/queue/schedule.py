"""Scheduling by memory plan: each render job carries what it needs, each worker says what it has, and a
worker claims only the jobs that fit it.

At submit, a render is planned against no budget at all (vidgen.memory.plan_render with `every`): every
way of holding its weights (placement, weight dtype, text encoder place) with its device and host peak
and its expected time. That list is the job's `needs`, stored with it; no weight is read. A worker
declares its device's memory (`vidgen queue worker --device cuda:0` measures it, `--device-budget 24GiB`
says it) and its host memory; it claims a job only if one of the job's ways fits both, and then renders
with that budget, so the planner picks the fastest way that fits *its* card. Workers are listed in the
ledger (`workers`, refreshed at every claim), so `queue list` can say of a job that fits none of the
live ones what it needs and what the largest has.

Fairness: a worker takes first, at the head's priority, the jobs that no smaller live worker could run,
then the others, oldest first. A big job therefore waits at most for the job each big worker is running,
never behind a stream of small jobs the small workers could take (tests/test_queue_schedule.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

LIVE_S = 120.0
"""A worker seen within this many seconds is live (it claims every poll; a busy one at each job's end)."""
SCHEMA_V2 = ("ALTER TABLE jobs ADD COLUMN needs TEXT",
             "CREATE TABLE workers (owner TEXT PRIMARY KEY, device_type TEXT NOT NULL, device_bytes INTEGER, "
             "host_bytes INTEGER, devices INTEGER NOT NULL DEFAULT 1, seen REAL NOT NULL)")
"""Version 2 of the ledger: a job's needs (JSON, null = unknown: fits anywhere) and the workers' facts."""


@dataclass(frozen=True)
class WorkerFacts:
    """What a worker has: its device type, its device's and host's memory for renders (bytes; None =
    not declared: no limit is applied)."""

    device_type: str = "cuda"
    device_bytes: int | None = None
    host_bytes: int | None = None
    devices: int = 1

    @classmethod
    def of(cls, row) -> "WorkerFacts":
        """From a row of the ledger's `workers` table (or live_workers' dict of one)."""
        return cls(row["device_type"], row["device_bytes"], row["host_bytes"], row["devices"])


def needs_of(planned, device_type: str) -> dict:
    """A job's needs from a vidgen.memory.Planned of every candidate: the (device, host) peaks of each way,
    fastest first, without the ways another is no worse than in both memory and time."""
    ways = sorted({(p.device_peak_bytes, p.host_peak_bytes, round(p.slowdown, 3)) for p in planned.tried},
                  key=lambda w: (w[2], w[0], w[1]))
    kept = [w for w in ways if not any(o != w and o[0] <= w[0] and o[1] <= w[1] and o[2] <= w[2] for o in ways)]
    return {"device_type": device_type, "ways": [list(w) for w in kept]}


def fits(needs: dict | None, worker: WorkerFacts | None) -> bool:
    """Whether some way of the job fits the worker (unknown needs, or an undeclared worker: yes). A job
    planned for the CPU is judged by host memory alone."""
    if not needs or worker is None:
        return True
    host = worker.host_bytes if worker.host_bytes is not None else float("inf")
    device = worker.device_bytes if worker.device_bytes is not None else float("inf")
    if needs.get("device_type") == "cpu":         # the device is the host: both peaks are host memory
        return any(d + h <= host for d, h, _ in needs["ways"])
    return any(d <= device and h <= host for d, h, _ in needs["ways"])


def least(needs: dict | None) -> tuple[int, int] | None:
    """(device, host) bytes of the way that needs the least device memory."""
    if not needs or not needs.get("ways"):
        return None
    d, h, _ = min(needs["ways"], key=lambda w: (w[0], w[1]))
    return d, h


def unplaceable(needs: dict | None, workers: list[dict]) -> str | None:
    """Why no live worker (`Scheduling.live_workers`) can claim a job of `needs`, or None when one can (or
    none has declared what it has: then any claims it)."""
    declared = [WorkerFacts.of(w) for w in workers]
    if not needs or not declared or any(fits(needs, w) for w in declared):
        return None
    d, h = least(needs)
    if needs.get("device_type") == "cpu":
        top = max((w.host_bytes or 0) for w in declared)
        return f"needs {_size_text(d + h)} of host memory; largest worker {_size_text(top)}"
    top = max(declared, key=lambda w: (w.device_bytes or 0, w.host_bytes or 0))
    if d > (top.device_bytes or 0):
        return f"needs {_size_text(d)}; largest worker {_size_text(top.device_bytes or 0)}"
    return f"needs {_size_text(h)} of host memory with {_size_text(d)} on the device; no live worker has both"


def _size_text(n: int) -> str:
    """'22 GiB', '7.5 GiB', or budgets.format_bytes below a GiB: how a person says a card's size."""
    from ..budgets import format_bytes

    return f"{n / 2**30:.1f}".removesuffix(".0") + " GiB" if n >= 2**30 else format_bytes(n)


class Scheduling:
    """The ledger's worker registry and memory-aware pick (vidgen.queue.ledger.Ledger has them)."""

    @staticmethod
    def _seen(db, owner: str, worker: WorkerFacts, now: float) -> None:
        db.execute("INSERT OR REPLACE INTO workers (owner, device_type, device_bytes, host_bytes, devices, seen) "
                   "VALUES (?, ?, ?, ?, ?, ?)", (owner, worker.device_type, worker.device_bytes, worker.host_bytes,
                                                 worker.devices, now))

    def forget_worker(self, owner: str) -> None:
        """A worker that stops says so: it no longer counts as live."""
        with self._use() as db:
            db.execute("DELETE FROM workers WHERE owner = ?", (owner,))

    def live_workers(self) -> list[dict[str, Any]]:
        """The workers seen within LIVE_S, with what they declared."""
        with self._use() as db:
            rows = db.execute("SELECT * FROM workers WHERE seen >= ? ORDER BY owner", (self._clock() - LIVE_S,))
            return [dict(r) for r in rows.fetchall()]

    def _pick(self, db, rows: list, worker: WorkerFacts | None, owner: str, now: float):
        """The row `worker` claims among `rows` (queued, in priority-then-age order): the fitting ones; at the
        head's priority, first those no smaller live worker fits."""
        fitting = [r for r in rows if fits(_needs(r), worker)]
        if not fitting or worker is None:
            return fitting[0] if fitting else None
        others = [WorkerFacts.of(w) for w in
                  db.execute("SELECT * FROM workers WHERE seen >= ? AND owner != ?", (now - LIVE_S, owner))]
        smaller = [w for w in others if _size(w) < _size(worker)]
        top = [r for r in fitting if r["priority"] == fitting[0]["priority"]]
        return next((r for r in top if not any(fits(_needs(r), w) for w in smaller)), fitting[0])


def _needs(row) -> dict | None:
    return json.loads(row["needs"]) if row["needs"] else None


def _size(w: WorkerFacts) -> tuple[float, float]:
    inf = float("inf")
    return (w.device_bytes if w.device_bytes is not None else inf, w.host_bytes if w.host_bytes is not None else inf)
