"""The job ledger: state machine, leases, dependencies, failure handling, and concurrent claimers."""

from __future__ import annotations

import json
import multiprocessing as mp
import sqlite3
import threading
import time

import pytest

from vidgen.errors import InputError
from vidgen.queue import ledger as ledger_module
from vidgen.queue.ledger import Control, FailureKind, JobSpec, JobState, Ledger, default_path


class Clock:
    """A clock the test moves by hand, so leases and backoff need no sleeping."""

    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def ledger(tmp_path, clock):
    with Ledger(tmp_path / "queue.db", clock=clock, backoff_s=5) as led:
        yield led


def spec(name: str = "", **kw) -> JobSpec:
    return JobSpec(kind=kw.pop("kind", "render"), payload=kw.pop("payload", {"prompt": name}), name=name, **kw)


def states(led: Ledger, ids) -> list[str]:
    return [led.get(i).state.value for i in ids]


def attempts(led: Ledger, job_id: int) -> list[tuple]:
    """The job's attempt rows: (owner, outcome), outcome None while the attempt runs."""
    with sqlite3.connect(led.path) as db:
        return db.execute("SELECT owner, outcome FROM attempts WHERE job = ? ORDER BY attempt", (job_id,)).fetchall()


# -- storage ---------------------------------------------------------------------------------------


def test_schema_wal_and_version(tmp_path):
    path = tmp_path / "sub" / "queue.db"
    Ledger(path).close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA user_version").fetchone()[0] == ledger_module.SCHEMA_VERSION
    db.execute(f"PRAGMA user_version = {ledger_module.SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(InputError, match="newer than this vidgen"):
        Ledger(path)


def test_reopen_keeps_jobs(tmp_path):
    with Ledger(tmp_path / "q.db") as led:
        (job_id,) = led.submit([spec("a")])
    with Ledger(tmp_path / "q.db") as led:
        assert led.get(job_id).payload == {"prompt": "a"} and led.integrity_check() == "ok"


def test_network_filesystem_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(ledger_module, "filesystem", lambda path: "nfs4")
    with pytest.raises(InputError, match="network filesystem \\(nfs4\\).*local"):
        Ledger(tmp_path / "q.db")


def test_default_path(monkeypatch, tmp_path):
    monkeypatch.setenv("VIDGEN_QUEUE", str(tmp_path / "x.db"))
    assert default_path() == tmp_path / "x.db"
    monkeypatch.delenv("VIDGEN_QUEUE")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert default_path() == tmp_path / "data" / "vidgen" / "queue.db"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert str(default_path()).endswith(".local/share/vidgen/queue.db")


# -- state machine ---------------------------------------------------------------------------------


def test_happy_path(ledger, clock):
    (job_id,) = ledger.submit([spec("a", output="out/a.mp4", group="batch1")])
    job = ledger.get(job_id)
    assert job.state is JobState.QUEUED and job.attempts == 0 and job.output == "out/a.mp4"
    claimed = ledger.claim("w1", lease_s=30)
    assert claimed.id == job_id and claimed.state is JobState.RUNNING
    assert (claimed.lease_owner, claimed.lease_expires, claimed.attempts, claimed.attempt) == ("w1", clock.t + 30, 1, 1)
    assert ledger.claim("w2") is None                       # nothing else to run
    clock.advance(5)
    assert ledger.heartbeat(job_id, "w1", lease_s=30, checkpoint="ckpt/a.pt") is Control.CONTINUE
    assert ledger.get(job_id).lease_expires == clock.t + 30
    assert ledger.complete(job_id, "w1", result={"seconds": 5.0})
    job = ledger.get(job_id)
    assert job.state is JobState.SUCCEEDED and job.finished == clock.t and job.lease_owner is None
    assert job.output == "out/a.mp4" and job.result == {"seconds": 5.0} and job.checkpoint == "ckpt/a.pt"
    assert [o for _, o in attempts(ledger, job_id)] == ["succeeded"]
    assert json.loads(json.dumps(job.to_dict()))["state"] == "succeeded"
    assert [j.id for j in ledger.jobs(state="succeeded", group="batch1")] == [job_id]
    assert ledger.jobs(JobState.QUEUED) == [] and ledger.jobs(group="other") == []


def test_unknown_ids_and_illegal_transitions(ledger):
    for call in (lambda: ledger.get(12), lambda: ledger.cancel(12), lambda: ledger.retry(12),
                 lambda: ledger.log(12, "x"), lambda: ledger.logs(12), lambda: ledger.heartbeat(12, "w")):
        with pytest.raises(InputError, match=f"^no job #12 in {ledger.path}$"):
            call()
    (job_id,) = ledger.submit([spec("a")])
    with pytest.raises(InputError, match="is queued; only failed, canceled or blocked jobs can be retried"):
        ledger.retry(job_id)
    ledger.claim("w")
    ledger.complete(job_id, "w")
    with pytest.raises(InputError, match=f"job #{job_id} is succeeded; only failed, canceled or blocked"):
        ledger.retry(job_id)
    with pytest.raises(InputError, match="is succeeded; only queued, waiting, paused or running jobs can be canceled"):
        ledger.cancel(job_id)
    with pytest.raises(InputError, match="is succeeded; only queued, waiting or running jobs can be paused"):
        ledger.pause(job_id)
    with pytest.raises(InputError, match="only paused jobs can be resumed"):
        ledger.resume(job_id)
    with pytest.raises(InputError, match="unknown job state 'done'"):
        ledger.jobs(state="done")


def test_submit_reports_every_problem_and_adds_nothing(ledger):
    bad = [spec("a", deps=[0]), spec("b", payload={"x": object()}), spec("c", deps=[5], max_attempts=0),
           spec("d", after=[99])]
    with pytest.raises(InputError) as e:
        ledger.submit(bad)
    msg = str(e.value)
    assert "\n" not in msg
    for part in ("job 0 (a): deps index 0 must point at an earlier job", "job 1 (b): payload must be a JSON",
                 "job 2 (c): max_attempts must be", "job 2 (c): deps index 5", "job 3: after names job #99"):
        assert part in msg
    assert ledger.jobs() == []
    assert ledger.submit([]) == []


def test_claim_order_priority_then_age_and_kinds(ledger):
    ids = ledger.submit([spec("low"), spec("high", priority=5), spec("low2"), spec("mid", priority=1),
                         spec("other", kind="stitch", priority=9)])
    assert ledger.claim("w", kinds=["render"]).id == ids[1]
    assert ledger.claim("w", kinds=["render"]).id == ids[3]
    assert ledger.claim("w").id == ids[4]
    assert [ledger.claim("w").id, ledger.claim("w").id] == [ids[0], ids[2]]
    assert ledger.claim("w", kinds=[]) is None


def test_run_after_and_backoff_delay_claims(ledger, clock):
    a, b = ledger.submit([spec("a", priority=1), spec("b")])
    ledger.claim("w")
    assert ledger.fail(a, "w", "flaky network", FailureKind.OTHER) is JobState.QUEUED
    assert ledger.get(a).run_after == clock.t + 5
    assert ledger.claim("w").id == b                        # a backs off although its priority is higher
    assert ledger.claim("w") is None
    clock.advance(5)
    assert ledger.claim("w").id == a


# -- leases ----------------------------------------------------------------------------------------


def test_expired_lease_is_redelivered(ledger, clock):
    (job_id,) = ledger.submit([spec("a")])
    ledger.claim("dead", lease_s=10)
    clock.advance(9)
    assert ledger.claim("w2") is None                       # still leased
    clock.advance(2)
    job = ledger.claim("w2", lease_s=10)                    # the dead worker's job, delivered again
    assert (job.id, job.lease_owner, job.attempts, job.attempt) == (job_id, "w2", 2, 2)
    assert job.error == "lease expired (worker died?)"
    # the first owner wakes up: it has lost the job and cannot touch it
    assert ledger.heartbeat(job_id, "dead") is Control.LOST
    assert ledger.complete(job_id, "dead") is False
    assert ledger.fail(job_id, "dead", "x", FailureKind.OTHER) is JobState.RUNNING
    ledger.release(job_id, "dead")
    ledger.finish_canceled(job_id, "dead")
    assert ledger.get(job_id).lease_owner == "w2" and ledger.get(job_id).state is JobState.RUNNING
    assert attempts(ledger, job_id) == [("dead", "lost"), ("w2", None)]
    assert ledger.logs(job_id, attempt=1)[0][2] == "lease of dead expired"
    assert ledger.complete(job_id, "w2")


def test_heartbeat_keeps_lease(ledger, clock):
    (job_id,) = ledger.submit([spec("a")])
    ledger.claim("w", lease_s=10)
    for _ in range(5):
        clock.advance(8)
        assert ledger.heartbeat(job_id, "w", lease_s=10) is Control.CONTINUE
        assert ledger.claim("thief") is None
    clock.advance(8)                                        # expired but not reclaimed: still the owner's
    assert ledger.complete(job_id, "w")


def test_lease_expiry_out_of_attempts_fails(ledger, clock):
    a, b = ledger.submit([spec("a", max_attempts=2), spec("b", deps=[0])])
    for owner in ("w1", "w2"):
        assert ledger.claim(owner, lease_s=1).id == a
        clock.advance(2)
    assert ledger.claim("w3") is None
    job = ledger.get(a)
    assert job.state is JobState.FAILED and job.error == "lease expired (worker died?)"
    assert ledger.get(b).error == f"dependency #{a} failed: lease expired (worker died?)"


def test_complete_by_non_owner_is_refused(ledger):
    (job_id,) = ledger.submit([spec("a")])
    ledger.claim("w1")
    assert ledger.complete(job_id, "w2", output="evil.mp4") is False
    job = ledger.get(job_id)
    assert job.state is JobState.RUNNING and job.output is None and job.lease_owner == "w1"
    assert ledger.heartbeat(job_id, "w2", checkpoint="x") is Control.LOST
    assert ledger.heartbeat(job_id, "w1", checkpoint="c1") is Control.CONTINUE
    assert ledger.get(job_id).checkpoint == "c1"


def test_progress_and_eta(ledger, clock):
    (job_id,) = ledger.submit([spec("a")])
    ledger.claim("w")
    ledger.heartbeat(job_id, "w", progress={"stage": "denoise", "step": 0, "total": 20})
    assert ledger.get(job_id).progress["eta_s"] is None     # no rate yet
    clock.advance(10)
    ledger.heartbeat(job_id, "w", progress={"step": 5})
    p = ledger.get(job_id).progress
    assert (p["stage"], p["step"], p["total"], p["eta_s"], p["updated"]) == ("denoise", 5, 20, 30.0, clock.t)
    clock.advance(1)
    ledger.heartbeat(job_id, "w", progress={"stage": "decode", "step": 0, "total": 4})   # a new stage: new rate
    assert ledger.get(job_id).progress["eta_s"] is None
    clock.advance(2)
    ledger.heartbeat(job_id, "w", progress={"step": 1})
    assert ledger.get(job_id).progress["eta_s"] == 6.0
    ledger.heartbeat(job_id, "w", progress={"eta_s": 99})   # the caller's own estimate wins
    assert ledger.get(job_id).progress["eta_s"] == 99


def test_list_shows_full_names_progress_bar_and_eta(ledger, clock, capsys):
    from vidgen.cli import main

    long_name = "a-workflow-with-a-long-name/shot-07-red-circle"     # 46 characters: shown whole
    running, _ = ledger.submit([spec(long_name), spec("b")])
    ledger.claim("w")
    ledger.heartbeat(running, "w", progress={"stage": "denoise", "step": 0, "total": 20})
    clock.advance(10)
    ledger.heartbeat(running, "w", progress={"step": 5})
    assert main(["queue", "--db", str(ledger.path), "list"]) == 0
    first, second = capsys.readouterr().out.splitlines()
    assert long_name in first and "[#####...............] denoise 5/20 ETA 30s" in first
    assert first.index("attempts") == second.index("attempts")      # columns line up


# -- dependencies ----------------------------------------------------------------------------------


def test_stitch_waits_for_its_shots(ledger):
    ids = ledger.submit([spec("shot1"), spec("shot2"), spec("shot3"),
                         spec("stitch", kind="stitch", deps=[0, 1, 2], priority=10)])
    assert states(ledger, ids) == ["queued"] * 3 + ["waiting-on-deps"]
    assert ledger.get(ids[3]).deps == ids[:3]
    for n in range(3):
        job = ledger.claim("w")
        assert job.id == ids[n]                             # the stitch, though first in priority, waits
        ledger.complete(job.id, "w", output=f"shot{n}.mp4")
        assert ledger.get(ids[3]).state is (JobState.QUEUED if n == 2 else JobState.WAITING)
    assert ledger.claim("w").id == ids[3]


def test_failed_dependency_fails_dependents_transitively_and_retry_restores(ledger):
    shot, other, stitch, upload = ledger.submit([spec("shot"), spec("other"), spec("stitch", deps=[0, 1]),
                                                 spec("upload", deps=[2])])
    ledger.claim("w")
    assert ledger.fail(shot, "w", "bad size 63x64", FailureKind.CONFIG) is JobState.FAILED
    assert states(ledger, [shot, other, stitch, upload]) == ["failed", "queued", "failed", "failed"]
    assert ledger.get(stitch).error == f"dependency #{shot} failed: bad size 63x64"
    assert ledger.get(upload).error == f"dependency #{stitch} failed: dependency #{shot} failed: bad size 63x64"
    assert (ledger.get(stitch).failed_dep, ledger.get(upload).failed_dep) == (shot, stitch)
    with pytest.raises(InputError, match=f"depends on job #{shot}, which is failed; retry #{shot} first"):
        ledger.retry(stitch)

    ledger.retry(shot)
    assert states(ledger, [shot, other, stitch, upload]) == ["queued", "queued", "waiting-on-deps", "waiting-on-deps"]
    assert ledger.get(shot).attempts == 0 and ledger.get(stitch).error is None
    for _ in range(2):
        ledger.complete(ledger.claim("w").id, "w")
    assert states(ledger, [stitch, upload]) == ["queued", "waiting-on-deps"]


def test_dependents_of_canceled_and_blocked_jobs_fail(ledger):
    a, b, c, d = ledger.submit([spec("a"), spec("b", deps=[0]), spec("c"), spec("d", deps=[2])])
    assert ledger.cancel(a) is JobState.CANCELED
    assert ledger.get(b).error == f"dependency #{a} canceled"
    assert ledger.claim("w").id == c
    assert ledger.fail(c, "w", "frames flagged", FailureKind.GUARD) is JobState.BLOCKED
    assert ledger.get(d).error == f"dependency #{c} blocked-by-guard: frames flagged"


def test_after_names_existing_jobs(ledger):
    done, bad = ledger.submit([spec("done"), spec("bad")])
    ledger.complete(ledger.claim("w").id, "w")
    ledger.fail(ledger.claim("w").id, "w", "broken config", FailureKind.CONFIG)
    ok, doomed, mixed = ledger.submit([spec("ok", after=[done]), spec("doomed", after=[bad]),
                                       spec("mixed", deps=[0], after=[done])])
    assert states(ledger, [ok, doomed, mixed]) == ["queued", "failed", "waiting-on-deps"]
    assert ledger.get(doomed).error == f"dependency #{bad} failed: broken config"
    ledger.retry(bad)
    assert ledger.get(doomed).state is JobState.WAITING


# -- failure classification ------------------------------------------------------------------------


def test_config_failure_is_final(ledger):
    (job_id,) = ledger.submit([spec("a")])
    ledger.claim("w")
    assert ledger.fail(job_id, "w", "num_frames must be 4k+1", FailureKind.CONFIG) is JobState.FAILED
    job = ledger.get(job_id)
    assert (job.attempts, job.failure_kind, job.error) == (1, FailureKind.CONFIG, "num_frames must be 4k+1")
    assert ledger.claim("w") is None


def test_guard_failure_blocks(ledger):
    (job_id,) = ledger.submit([spec("a")])
    ledger.claim("w")
    assert ledger.fail(job_id, "w", "prompt refused", "guard") is JobState.BLOCKED
    assert ledger.get(job_id).state.value == "blocked-by-guard" and ledger.claim("w") is None
    ledger.retry(job_id)                                    # a person decided it is fine
    assert ledger.claim("w").id == job_id


def test_oom_retries_at_once_with_the_patch(ledger, clock):
    (job_id,) = ledger.submit([spec("a", payload={"size": "1280x720", "vae": {"tile": 512, "dtype": "bf16"}})])
    ledger.claim("w")
    patch = {"vae": {"tile": 256}, "offload": "model"}
    assert ledger.fail(job_id, "w", "CUDA out of memory", FailureKind.OOM, payload_patch=patch) is JobState.QUEUED
    job = ledger.claim("w")
    assert job.id == job_id and job.attempts == 2
    assert job.payload == {"size": "1280x720", "vae": {"tile": 256, "dtype": "bf16"}, "offload": "model"}
    ledger.fail(job_id, "w", "CUDA out of memory", FailureKind.OOM, payload_patch={"vae": {"tile": 128}})
    ledger.claim("w")
    assert ledger.fail(job_id, "w", "CUDA out of memory", FailureKind.OOM) is JobState.FAILED
    job = ledger.get(job_id)
    assert job.payload["vae"]["tile"] == 128 and job.error == "CUDA out of memory (gave up after 3 attempts)"


def test_other_failure_backs_off_doubling_until_max_attempts(ledger, clock):
    (job_id,) = ledger.submit([spec("a", max_attempts=4)])
    delays = []
    for _ in range(3):
        ledger.claim("w")
        assert ledger.fail(job_id, "w", "disk hiccup", FailureKind.OTHER) is JobState.QUEUED
        delays.append(ledger.get(job_id).run_after - clock.t)
        clock.advance(delays[-1])
    assert delays == [5, 10, 20]
    ledger.claim("w")
    assert ledger.fail(job_id, "w", "disk hiccup", FailureKind.OTHER) is JobState.FAILED
    assert ledger.get(job_id).attempts == 4 and ledger.claim("w") is None
    assert [o for _, o in attempts(ledger, job_id)] == ["other"] * 4


def test_backoff_is_capped(tmp_path, clock):
    with Ledger(tmp_path / "q.db", clock=clock, backoff_s=100, backoff_max_s=150) as led:
        (job_id,) = led.submit([spec("a", max_attempts=5)])
        for expected in (100, 150, 150):
            led.claim("w")
            led.fail(job_id, "w", "x", FailureKind.OTHER)
            assert led.get(job_id).run_after - clock.t == expected
            clock.advance(expected)


# -- cancel, pause, release ------------------------------------------------------------------------


def test_cancel_queued_and_running(ledger):
    a, b, c = ledger.submit([spec("a"), spec("b"), spec("c", deps=[1])])
    assert ledger.cancel(a) is JobState.CANCELED and ledger.cancel(a) is JobState.CANCELED
    assert ledger.claim("w").id == b
    assert ledger.cancel(b) is JobState.RUNNING             # a request, not yet done
    ledger.pause(b)                                         # a cancel request is not downgraded
    assert ledger.heartbeat(b, "w") is Control.CANCEL
    ledger.finish_canceled(b, "w")
    assert states(ledger, [a, b, c]) == ["canceled", "canceled", "failed"]
    assert [o for _, o in attempts(ledger, b)] == ["canceled"]
    ledger.retry(b)
    assert states(ledger, [b, c]) == ["queued", "waiting-on-deps"]


def test_cancel_request_wins_over_retry_and_release(ledger):
    a, b = ledger.submit([spec("a"), spec("b")])
    ledger.claim("w")
    ledger.cancel(a)
    assert ledger.fail(a, "w", "boom", FailureKind.OTHER) is JobState.CANCELED
    ledger.claim("w")
    ledger.cancel(b)
    ledger.release(b, "w")
    assert ledger.get(b).state is JobState.CANCELED


def test_pause_and_resume_queued_job(ledger):
    a, b = ledger.submit([spec("a"), spec("b", deps=[0])])
    ledger.pause(a)
    ledger.pause(b)
    ledger.pause(a)                                         # twice is fine
    assert states(ledger, [a, b]) == ["paused", "paused"]
    assert ledger.claim("w") is None
    ledger.resume(a)
    ledger.resume(b)
    assert states(ledger, [a, b]) == ["queued", "waiting-on-deps"]
    assert ledger.claim("w").id == a


def test_pause_running_job_releases_without_counting(ledger):
    (job_id,) = ledger.submit([spec("a", max_attempts=1)])
    ledger.claim("w")
    ledger.pause(job_id)
    assert ledger.heartbeat(job_id, "w", checkpoint="ckpt/step12.pt") is Control.PAUSE
    ledger.release(job_id, "w", paused=True)
    job = ledger.get(job_id)
    assert (job.state, job.attempts, job.checkpoint) == (JobState.PAUSED, 0, "ckpt/step12.pt")
    assert ledger.claim("w") is None
    ledger.resume(job_id)
    job = ledger.claim("w")                                 # max_attempts=1 and still runnable
    assert (job.id, job.attempts, job.attempt, job.checkpoint) == (job_id, 1, 2, "ckpt/step12.pt")
    ledger.pause(job_id)
    ledger.resume(job_id)                                   # withdrawn before the worker saw it
    assert ledger.heartbeat(job_id, "w") is Control.CONTINUE
    assert [o for _, o in attempts(ledger, job_id)] == ["paused", None]


def test_graceful_release_requeues(ledger, clock):
    (job_id,) = ledger.submit([spec("a")])
    ledger.claim("w")
    ledger.heartbeat(job_id, "w", checkpoint="c")
    ledger.release(job_id, "w")
    job = ledger.get(job_id)
    assert (job.state, job.attempts, job.lease_owner, job.checkpoint) == (JobState.QUEUED, 0, None, "c")
    assert ledger.claim("w2").id == job_id


def test_global_pause(ledger):
    a, b = ledger.submit([spec("a"), spec("b")])
    ledger.claim("w")
    ledger.pause()
    assert ledger.is_paused() and ledger.claim("w") is None
    assert ledger.heartbeat(a, "w") is Control.CONTINUE     # running jobs go on
    assert ledger.complete(a, "w")
    ledger.resume()
    assert not ledger.is_paused() and ledger.claim("w").id == b


# -- logs ------------------------------------------------------------------------------------------


def test_logs_per_attempt(ledger, clock):
    (job_id,) = ledger.submit([spec("a")])
    ledger.log(job_id, "submitted by test")
    ledger.claim("w")
    ledger.log(job_id, "loading model")
    ledger.fail(job_id, "w", "CUDA out of memory", FailureKind.OOM, payload_patch={"tile": 128})
    ledger.claim("w")
    clock.advance(1)
    ledger.log(job_id, "decode with tile 128")
    assert [(a, text) for a, _, text in ledger.logs(job_id)] == [
        (0, "submitted by test"), (1, "loading model"), (1, "failed (oom): CUDA out of memory"),
        (2, "decode with tile 128")]
    assert ledger.logs(job_id, attempt=2) == [(2, clock.t, "decode with tile 128")]
    assert ledger.logs(job_id, attempt=7) == []


# -- concurrency -----------------------------------------------------------------------------------


def test_heartbeat_thread_shares_the_ledger(ledger):
    """A worker thread and its heartbeat thread on one Ledger object."""
    ids = ledger.submit([spec(str(i)) for i in range(30)])
    job = ledger.claim("w", lease_s=600)
    stop, errors = threading.Event(), []

    def beat():
        try:
            while not stop.is_set():
                assert ledger.heartbeat(job.id, "w", lease_s=600, progress={"step": 1, "total": 2}) is Control.CONTINUE
        except Exception as e:                              # surfaced in the main thread
            errors.append(e)

    thread = threading.Thread(target=beat)
    thread.start()
    for _ in ids[1:]:
        other = ledger.claim("w2")
        ledger.log(other.id, "hi")
        ledger.complete(other.id, "w2")
    stop.set()
    thread.join()
    assert not errors and ledger.complete(job.id, "w")
    assert len(ledger.jobs(state="succeeded")) == 30


def _claim_and_hang(path: str) -> None:
    Ledger(path).claim("doomed", lease_s=1.0)
    time.sleep(120)                                         # "rendering" until killed


def test_job_of_a_killed_worker_is_delivered_again(tmp_path):
    """At-least-once: a worker process killed mid-job (no release, no heartbeat) loses the job to the next."""
    path = tmp_path / "queue.db"
    with Ledger(path) as led:
        (job_id,) = led.submit([spec("a")])
        proc = mp.get_context("spawn").Process(target=_claim_and_hang, args=(str(path),))
        proc.start()
        deadline = time.time() + 60
        while led.get(job_id).state is not JobState.RUNNING and time.time() < deadline:
            time.sleep(0.02)
        proc.kill()
        proc.join()
        job = led.get(job_id)
        assert (job.state, job.lease_owner) == (JobState.RUNNING, "doomed")
        time.sleep(max(0.0, job.lease_expires - time.time()) + 0.05)
        again = led.claim("w2")
        assert (again.id, again.attempt, again.lease_owner) == (job_id, 2, "w2")
        assert led.complete(job_id, "w2")
        assert attempts(led, job_id) == [("doomed", "lost"), ("w2", "succeeded")]


def _claim_all(path: str, owner: str, barrier, results) -> None:
    led = Ledger(path)
    barrier.wait()                                          # every process starts claiming at once
    got = []
    while (job := led.claim(owner, lease_s=300)) is not None:
        got.append(job.id)
        time.sleep(0.001)                                   # "render": lets the others take the write lock
        assert led.heartbeat(job.id, owner, progress={"step": 1, "total": 1}) is Control.CONTINUE
        assert led.complete(job.id, owner, output=f"{job.id}.mp4")
    led.close()
    results.put((owner, got))


def test_four_processes_claim_each_job_exactly_once(tmp_path):
    path = str(tmp_path / "queue.db")
    with Ledger(path) as led:
        ids = led.submit([spec(str(i), priority=i % 3) for i in range(400)])
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_claim_all, args=(path, f"w{n}", barrier, results)) for n in range(4)]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    claimed = [job_id for ids_ in got.values() for job_id in ids_]
    assert len(claimed) == 400 and sorted(claimed) == ids  # each exactly once
    assert sum(1 for ids_ in got.values() if ids_) >= 2     # they really competed
    with Ledger(path) as led:
        jobs = led.jobs()
        assert all(j.state is JobState.SUCCEEDED and j.attempts == 1 for j in jobs)
        assert all(j.lease_owner is None and j.output == f"{j.id}.mp4" for j in jobs)
        assert led.integrity_check() == "ok"


def test_a_claimed_job_starts_with_no_progress(tmp_path, monkeypatch):
    """A worker's next job shows no progress until it reports its own: neither the ledger's claim
    nor the worker's first heartbeat carries the previous job's last step ("decode 2/17" on a stitch)."""
    from vidgen.pipeline import Progress
    from vidgen.queue import executor as executor_module

    led = Ledger(tmp_path / "q.db")
    first, second = led.submit([spec("render", kind="render"), spec("stitch", kind="stitch")])
    seen = {}

    def until(what, fn, timeout=10.0):
        end = time.monotonic() + timeout
        while not (value := fn()):
            assert time.monotonic() < end, f"timed out waiting for {what}"
            time.sleep(0.01)
        return value

    def fake(ex, job):
        claimed = led.get(job.id)
        seen[job.id] = claimed.progress
        if job.id == first:
            ex.progress(Progress("decode", 2, 17))
            until("the progress beat", lambda: led.get(job.id).progress.get("stage") == "decode")
        else:                                       # the first heartbeat of this job has renewed the lease
            until("the first beat", lambda: led.get(job.id).lease_expires > claimed.lease_expires)
            seen["after beat"] = led.get(job.id).progress
        return None, {}
    for kind in ("render", "stitch"):
        monkeypatch.setitem(executor_module.KINDS, kind, fake)
    ex = executor_module.Executor(led, "w", lease_s=60, heartbeat_s=0.02)
    assert ex.execute(led.claim("w")) == "succeeded"
    assert led.get(first).progress["stage"] == "decode"
    assert ex.execute(led.claim("w")) == "succeeded"
    assert seen[second] == {} and "stage" not in seen["after beat"], seen
    assert "stage" not in led.get(second).progress
