"""`vidgen queue worker`: claim jobs from the ledger and run them until stopped (or idle).

One process per device: with `devices=[0, 1]` the worker starts one child per GPU (each sees only
its own through CUDA_VISIBLE_DEVICES) and waits for them. Each process keeps its pipeline warm
between jobs. SIGTERM (or Ctrl-C) stops gracefully: the running job stops after its current step,
checkpoints, and goes back to the queue with its lease released. A worker whose jobs keep failing
for one reason of its machine (a package or device missing: executor.ENVIRONMENT_STREAK in a row)
gives them back and stops with that reason (EnvironmentProblem, exit 2), instead of failing them all.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from ..errors import EnvironmentProblem
from .executor import Executor
from .ledger import Ledger

log = logging.getLogger("vidgen")

def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def idle(ledger: Ledger) -> bool:
    """No job left that could still run here (paused ones wait for `vidgen queue resume`, shots awaiting
    review for a person's decision, and what depends on them with them)."""
    return not ledger.has_unfinished()


def run_worker(db: str | Path, *, exit_when_idle: bool = False, poll_s: float = 0.5, lease_s: float = 60.0, facts=None,
               devices: int = 1) -> int:
    """Claim and execute jobs in this process; returns the number of jobs it ran. `devices`: how many it
    holds (`--gpus`): it claims renders asking for up to that many (parallel.devices) and runs each on
    its ranks.

    Raises:
        EnvironmentProblem: the last jobs all failed for one reason of this machine (their attempts
            not counted, the jobs queued again).
    """
    ledger = Ledger(db)
    owner = worker_id()
    ex = Executor(ledger, owner, lease_s=lease_s)
    ex.facts = facts            # schedule.WorkerFacts: what it declared; only jobs that fit are claimed

    def stop(signum, frame):
        log.info("worker %s: stopping after the current step (signal %d)", owner, signum)
        ex.stopping = True

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    ran = 0
    log.info("worker %s on %s%s", owner, db, f" with {devices} devices" if devices > 1 else "")
    try:
        while not ex.stopping:
            job = ledger.claim(owner, lease_s, devices=devices, worker=facts)
            if job is None:
                if exit_when_idle and idle(ledger):
                    break
                time.sleep(poll_s)
                continue
            log.info("job #%d (%s%s): started, attempt %d", job.id, job.kind, f" {job.name}" if job.name else "",
                     job.attempts)
            outcome = ex.execute(job)
            log.info("job #%d: %s", job.id, outcome)
            ran += 1
            if (why := ex.stop_reason()) is not None:
                raise EnvironmentProblem(why)
    finally:
        ex.close_ranks()
        if facts is not None:
            ledger.forget_worker(owner)
        for s, handler in old.items():
            signal.signal(s, handler)
    return ran


def run_device_workers(db: str | Path, devices: list[str], args: list[str]) -> int:
    """One worker process per device; SIGTERM is passed on to all of them. Returns the worst exit code."""
    children = []
    for dev in devices:
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": dev}
        children.append(subprocess.Popen([sys.executable, "-m", "vidgen", "queue", "--db", str(db), "worker", *args],
                                          env=env))
    def forward(signum, frame):
        for c in children:
            c.send_signal(signum)
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    return max(c.wait() for c in children)
