"""Ray backend: a dispatcher that claims jobs from the ledger and runs them on Ray actors.

The ledger stays the single source of truth and is only touched by the dispatcher, on the machine
that holds the file (WAL needs a local disk). Each actor (`num_gpus=1` where the cluster has GPUs,
CPU actors otherwise) holds an Executor with a warm pipeline; it runs one job at a time and
returns an Outcome, which the dispatcher records. While a job runs the dispatcher renews its
lease, stores the actor's progress, and passes cancel/pause requests on. If an actor dies mid-job
(RayActorError), the job is failed as an ordinary error (retried with backoff) and the actor is
replaced. An actor that cannot even start (its __init__ fails: vidgen or torch does not import
there) and a job failing for want of a package or device are the environment's failures: the job
goes back to the queue uncounted, and after executor.ENVIRONMENT_STREAK of them in a row for one
reason the dispatcher stops the running jobs and raises EnvironmentProblem with that reason.
A render asking for N devices (parallel.devices) runs in a placement group of N GPUs on one node, in
place of N pool actors (vidgen.parallel spawns its ranks there).
Needs the `ray` extra (errors.install_hint says how).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from ..errors import EnvironmentProblem, MissingExtra, install_hint
from .executor import Executor, Outcome
from .ledger import Control, FailureKind, Job, Ledger
from .worker import idle, worker_id

log = logging.getLogger("vidgen")


def _actor_class():
    import ray

    @ray.remote(max_concurrency=2)      # run() and progress()/stop() at once
    class RenderActor:
        def __init__(self):
            self.ex = Executor(None, "ray-actor")
            self.stop_reason: str | None = None
            self.ex.control = lambda: self.stop_reason

        def run(self, job: Job) -> Outcome:
            self.stop_reason = None
            self.ex.last_progress = None
            try:
                return self.ex.run(job)
            finally:        # a wide job's actor is killed after it: its ranks go first, not orphaned
                self.ex.close_ranks()

        def progress(self) -> dict | None:
            return self.ex.last_progress

        def stop(self, reason: str) -> None:
            self.stop_reason = reason

    return RenderActor


def run_ray_dispatcher(db: str | Path, *, address: str | None = None, num_actors: int | None = None,
                       exit_when_idle: bool = False, lease_s: float = 60.0, poll_s: float = 0.5,
                       on_start=None, facts=None) -> dict:
    """Dispatch jobs from the ledger to Ray actors until idle (or interrupted). Returns counts.

    Raises:
        EnvironmentProblem: the last jobs all failed for one reason of the actors' machines (the
            jobs queued again, their attempts not counted).
    """
    try:
        import ray
    except ImportError:
        raise MissingExtra(f"queue worker --backend ray needs Ray: {install_hint('ray')}") from None
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    gpus = int(ray.cluster_resources().get("GPU", 0))
    n = num_actors or max(1, gpus)
    cls = _actor_class()
    d = _Dispatcher(ray, cls.options(num_gpus=1 if gpus else 0), n, db, lease_s, gpus, cls)
    d.facts = facts         # schedule.WorkerFacts of each actor's GPU and host: only jobs that fit them are claimed
    if on_start is not None:
        on_start(d.actors)
    log.info("ray dispatcher %s: %d actor(s) on %s", d.owner, n, db)
    while True:
        d.hand_out()
        if not d.running:
            if d.stopping is not None:
                raise EnvironmentProblem(d.stopping)
            if exit_when_idle and idle(d.ledger):
                break
            time.sleep(poll_s)
            continue
        done, _ = ray.wait(list(d.running), timeout=poll_s)
        for ref in done:
            d.collect(ref)
        d.stop_if_failing()
        d.beat()
    return d.counts


class _Dispatcher:
    """One dispatcher's actors (free, and running: ObjectRef -> (actor, job)), its ledger and lease,
    its counts, and why it stops (its environment fails every job)."""

    def __init__(self, ray, actor_class, n: int, db: str | Path, lease_s: float, gpus: int = 0, base=None):
        self.ray, self.Actor, self.lease_s, self.gpus, self.Base = ray, actor_class, lease_s, gpus, base
        self.wide: dict = {}            # ObjectRef -> (the placement group, the pool actors it replaced)
        self.actors = [actor_class.remote() for _ in range(n)]
        self.ledger = Ledger(db)
        self.facts = None
        self.owner = worker_id()
        self.recorder = Executor(self.ledger, self.owner, lease_s=lease_s)  # records the actors' outcomes as this lease
        self.running: dict = {}
        self.free = list(self.actors)
        self.counts = {"succeeded": 0, "other": 0, "actor_deaths": 0}
        self.last_beat = 0.0
        self.stopping: str | None = None

    def hand_out(self) -> None:
        """A claimed job for every free actor, while there are jobs (and no reason to stop). A render asking
        for N devices (parallel.devices) takes N free actors' places: they go, and one actor in a placement
        group of N GPUs (one node) runs it, its ranks spawned there; the N come back after it."""
        while self.free and self.stopping is None:
            job = self.ledger.claim(self.owner, self.lease_s, devices=len(self.free), worker=self.facts)
            if job is None:
                break
            n = int((job.payload.get("parallel") or {}).get("devices", 1)) if job.kind == "render" else 1
            if n == 1:
                actor = self.free.pop()
                self.running[actor.run.remote(job)] = (actor, job)
                continue
            from ray.util.placement_group import placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            making_way = [self.free.pop() for _ in range(n)]
            try:    # Ray drops a kill that reaches an actor still being created, and its worker keeps the CPU/GPU
                self.ray.get([a.progress.remote() for a in making_way], timeout=120)
            except Exception:       # noqa: BLE001 - one that died or never started is killed below all the same
                pass
            for actor in making_way:
                self.ray.kill(actor, no_restart=True)
            group = placement_group([{"GPU": n} if self.gpus else {"CPU": 1}], strategy="STRICT_PACK")
            actor = self.Base.options(num_gpus=n if self.gpus else 0, scheduling_strategy=
                                       PlacementGroupSchedulingStrategy(group)).remote()
            ref = actor.run.remote(job)
            self.running[ref], self.wide[ref] = (actor, job), (group, n)
            log.info("job #%d: a placement group of %d %s", job.id, n, "GPUs" if self.gpus else "CPU ranks")

    def _back(self, ref, actor) -> None:
        """The actor that ran `ref` is free again; a wide job's actor and group go, its N actors come back."""
        if ref not in self.wide:
            self.free.append(actor)
            return
        from ray.util.placement_group import remove_placement_group

        group, n = self.wide.pop(ref)
        self.ray.kill(actor, no_restart=True)
        remove_placement_group(group)
        self.free += [self.Actor.remote() for _ in range(n)]

    def collect(self, ref) -> None:
        """Record the outcome of a finished run; its actor (or a new one, if it died) is free again."""
        actor, job = self.running.pop(ref)
        ledger, owner, errors = self.ledger, self.owner, self.ray.exceptions
        try:
            outcome: Outcome = self.ray.get(ref)
        except errors.RayActorError as e:   # the actor died mid-job: retry the job elsewhere
            self.counts["actor_deaths"] += 1
            if e.actor_init_failed:         # it never started: this machine's failure, not the job's
                reason = _init_failure(e)
                log.warning("job #%d: the Ray actor could not start: %s", job.id, reason)
                self.recorder.record(job, Outcome("failed", error=f"the Ray actor could not start: {reason}",
                                                  environment=True))
            else:
                ledger.fail(job.id, owner, f"the Ray actor died ({type(e).__name__})", FailureKind.OTHER)
            if ref in self.wide:
                self._back(ref, actor)
            else:
                self.free.append(self.Actor.remote())
            return
        except errors.RayError as e:
            ledger.fail(job.id, owner, f"Ray error: {e}".splitlines()[0], FailureKind.OTHER)
            self._back(ref, actor)
            return
        for text in outcome.logs:
            ledger.log(job.id, text)
        what = self.recorder.record(job, outcome)
        self.counts["succeeded" if what == "succeeded" else "other"] += 1
        log.info("job #%d: %s", job.id, what)
        self._back(ref, actor)

    def stop_if_failing(self) -> None:
        """Once the environment has failed every job of a streak: claim no more, and the running
        jobs stop at their next step, released."""
        if self.stopping is None and (why := self.recorder.stop_reason()) is not None:
            self.stopping = why
            for actor, _ in self.running.values():
                actor.stop.remote("shutdown")

    def beat(self) -> None:
        """Every heartbeat_s: renew the running jobs' leases, store their progress, pass cancel/pause on."""
        if time.monotonic() - self.last_beat < self.recorder.heartbeat_s:
            return
        self.last_beat = time.monotonic()
        for ref, (actor, job) in list(self.running.items()):
            try:
                progress = self.ray.get(actor.progress.remote(), timeout=5)
            except Exception:
                progress = None
            control = self.ledger.heartbeat(job.id, self.owner, self.lease_s, progress=progress)
            if control != Control.CONTINUE:
                actor.stop.remote(control.value)


def _init_failure(e) -> str:
    """The exception line of an actor's failed creation task (the last line of Ray's traceback text)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[-1] if lines else type(e).__name__
