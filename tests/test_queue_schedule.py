"""Scheduling by memory plan (vidgen.queue.schedule): renders carry their memory needs from submit, workers
declare what they have and claim only what fits, a job no live worker fits is reported, and a big job is
not starved by a stream of small ones."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from vidgen.cli import main
from vidgen.queue import api
from vidgen.queue.jobs import JobSpec, JobState
from vidgen.queue.ledger import SCHEMA_VERSION, Ledger
from vidgen.queue.schedule import WorkerFacts, fits, needs_of, unplaceable

GiB = 2**30
ROOT = Path(__file__).resolve().parents[1]
WORKERS = {"w8": WorkerFacts("cuda", 8 * GiB, 64 * GiB), "w24": WorkerFacts("cuda", 24 * GiB, 64 * GiB),
           "w80": WorkerFacts("cuda", 80 * GiB, 256 * GiB)}


def _needs(*ways: tuple[float, float, float]) -> dict:
    """Needs of ways (device GiB, host GiB, slowdown)."""
    return {"device_type": "cuda", "ways": [[int(d * GiB), int(h * GiB), s] for d, h, s in ways]}


def _job(name: str, gib: float, host: float = 8) -> JobSpec:
    return JobSpec(kind="render", payload={"n": name}, name=name, needs=_needs((gib, host, 1.0)))


def test_each_worker_claims_only_what_fits(tmp_path):
    """Workers of 8, 24 and 80 GiB: each takes only jobs one of whose ways fits it; a job that fits none
    waits, and `queue list` says what it needs and what the largest worker has."""
    ledger = Ledger(tmp_path / "q.db")
    ids = dict(zip(("small", "mid", "big", "huge"), ledger.submit(
        [_job("small", 6), _job("mid", 20), _job("big", 60), _job("huge", 100)])))
    # a job with a slower way that fits a smaller card: a 24 GiB worker can take it that way
    ids["either"] = ledger.submit([JobSpec(kind="render", payload={}, name="either",
                                           needs=_needs((40, 8, 1.0), (18, 30, 2.0)))])[0]
    with ledger._tx() as db:      # all three are live before anyone claims
        for owner, w in WORKERS.items():
            ledger._seen(db, owner, w, ledger._clock())
    got = {owner: [] for owner in WORKERS}
    for _ in range(3):
        for owner, w in WORKERS.items():
            job = ledger.claim(owner, 60, worker=w)
            if job is not None:
                got[owner].append(job.name)
                assert fits(job.needs, w)
                ledger.complete(job.id, owner)
    assert got["w8"] == ["small"]
    assert sorted(got["w24"]) == ["either", "mid"] and got["w80"] == ["big"]
    assert ledger.get(ids["huge"]).state == JobState.QUEUED
    assert unplaceable(ledger.get(ids["huge"]).needs, ledger.live_workers()) == "needs 100 GiB; largest worker 80 GiB"


def test_the_list_and_the_page_say_why_a_job_waits(tmp_path, capsys):
    ledger = Ledger(tmp_path / "q.db")
    ledger.submit([_job("huge", 22)])
    assert ledger.claim("w12", 60, worker=WorkerFacts("cuda", 12 * GiB, 64 * GiB)) is None
    assert main(["queue", "--db", str(tmp_path / "q.db"), "list"]) == 0
    assert "waits: needs 22 GiB; largest worker 12 GiB" in capsys.readouterr().out
    from vidgen.queue.service import Service

    svc = Service(tmp_path / "q.db", [tmp_path], None, 1 << 20, 0.5)
    assert svc.snapshot()[1]["waits"] == "needs 22 GiB; largest worker 12 GiB"


def test_a_big_job_is_not_starved_by_a_stream_of_small_ones(tmp_path):
    """10 small jobs queued, then a 60 GiB one, then more small ones keep coming while the three workers
    claim and finish: the 80 GiB worker takes the big job at its next claim; the small ones go on."""
    ledger = Ledger(tmp_path / "q.db")
    ledger.submit([_job(f"s{i}", 6) for i in range(10)])
    big = ledger.submit([_job("big", 60)])[0]
    with ledger._tx() as db:
        for owner, w in WORKERS.items():
            ledger._seen(db, owner, w, ledger._clock())
    claims_before_big, n = 0, 10
    while ledger.get(big).state == JobState.QUEUED:
        for owner, w in WORKERS.items():
            ledger.submit([_job(f"s{n}", 6)])     # the stream never stops
            n += 1
            job = ledger.claim(owner, 60, worker=w)
            if job is not None and job.id != big:
                claims_before_big += owner == "w80"
            if job is not None:
                ledger.complete(job.id, owner)
        assert claims_before_big <= 1, "the big job waited behind small ones on the only worker that fits it"
    assert ledger.get(big).state == JobState.SUCCEEDED and claims_before_big == 0
    # with only the big worker live, small jobs are its own to run, oldest first
    ledger.forget_worker("w8")
    ledger.forget_worker("w24")
    oldest = min(j.id for j in ledger.jobs("queued"))
    assert ledger.claim("w80", 60, worker=WORKERS["w80"]).id == oldest


def test_submit_plans_the_needs_and_a_worker_renders_in_its_declared_budget(tmp_path):
    """A render's needs come from its memory plan at submit (no weights read): every way, fastest first.
    A worker declaring too little leaves it; one declaring enough renders it with that budget."""
    cfg = {"model": {"path": str(ROOT / "samples" / "demo-wan"), "device": "cpu"}, "prompt": "a red circle",
           "size": "64x64", "num_frames": 9, "fps": 8, "seed": 1, "sampling": {"steps": 2},
           "output": {"path": str(tmp_path / "clip.mp4")}}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    specs = api.plan(tmp_path / "c.json")
    api.check_specs(specs)
    needs = specs[0].needs
    assert needs["device_type"] == "cpu" and needs["ways"] and needs["ways"][0][2] == 1.0
    ledger = Ledger(tmp_path / "q.db")
    ledger.submit(specs)
    least_host = min(d + h for d, h, _ in needs["ways"])      # on the CPU both peaks are host memory
    assert ledger.claim("tiny", 60, worker=WorkerFacts("cpu", None, least_host - 1)) is None
    from vidgen.queue.worker import run_worker

    run_worker(tmp_path / "q.db", exit_when_idle=True, lease_s=30, facts=WorkerFacts("cpu", None, 3 * GiB))
    (job,) = ledger.jobs()
    assert job.state == JobState.SUCCEEDED
    side = json.loads((tmp_path / "clip.mp4.json").read_text())
    assert side["memory_plan"]["host_budget"] == 3 * GiB
    assert [w["owner"] for w in ledger.live_workers()] == ["tiny"]     # a worker that stops is no longer counted


def test_a_version_1_ledger_is_brought_to_version_2(tmp_path):
    path = tmp_path / "old.db"
    Ledger(path).close()
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE jobs DROP COLUMN needs")
    db.execute("DROP TABLE workers")
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    ledger = Ledger(path)
    ledger.submit([_job("a", 1)])
    assert ledger.jobs()[0].needs["ways"] and SCHEMA_VERSION == 2


def test_needs_keep_only_the_ways_not_beaten_in_memory_and_time():
    class P:
        def __init__(self, d, h, s):
            self.device_peak_bytes, self.host_peak_bytes, self.slowdown = d, h, s

    class Planned:
        tried = [P(10, 5, 1.0), P(8, 5, 1.5), P(8, 6, 2.0), P(4, 9, 3.0)]
    assert needs_of(Planned, "cuda")["ways"] == [[10, 5, 1.0], [8, 5, 1.5], [4, 9, 3.0]]
