"""Queue benchmark: the ledger's throughput, and what the queue adds to a render.

    python bench/render_queue.py ledger  # 2000 jobs; 1 and 4 claiming processes
    python bench/render_queue.py ledger --jobs 4000 --procs 1 2 4 8 --json results.json
    python bench/render_queue.py render  # demo config, ~10 s renders: queued vs direct

`render`: configs/demo.yaml at 33 frames and 600 steps (about 10 s on 2 cores), rendered directly
with vidgen.render and through the queue (submit, claim, a fresh Executor with its heartbeat thread,
complete), alternating, in one process; both load the model each time. Target: <= 2% overhead.

`ledger`: for each process count, a fresh ledger in a temporary folder (local disk: the ledger
refuses a network filesystem). N jobs are submitted in batches of --batch, one transaction each
(jobs/s submitted). Then P spawned processes, released together by a barrier, each loop claim ->
complete until the queue is empty, as workers do: every claim and every complete is its own
BEGIN IMMEDIATE transaction under synchronous=FULL, so each commits with an fsync. claims/s = N /
wall time from the barrier to the last process's end; the run also checks that every job was
claimed exactly once and that `PRAGMA integrity_check` is ok. Target: >= 500 claims/s with 4
processes. Latencies are per call (p50 / p99 over all processes).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# This file is named like the stdlib's `queue`, which multiprocessing imports when it makes a Queue:
# take bench/ off the path (the spawned processes inherit this path).
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]


def _percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def _claimer(path: str, owner: str, work_s: float, barrier, results) -> None:
    """One worker process: claim -> (work) -> complete until the queue is empty."""
    from vidgen.queue.ledger import Ledger

    led = Ledger(path)
    claimed, claim_s, complete_s = [], [], []
    barrier.wait()
    while True:
        t0 = time.perf_counter()
        job = led.claim(owner, lease_s=300)
        claim_s.append(time.perf_counter() - t0)
        if job is None:
            break
        if work_s:
            time.sleep(work_s)
        t0 = time.perf_counter()
        assert led.complete(job.id, owner, output=f"{job.id}.mp4")
        complete_s.append(time.perf_counter() - t0)
        claimed.append(job.id)
    led.close()
    results.put({"owner": owner, "claimed": claimed, "end": time.monotonic(), "claim_s": claim_s,
                 "complete_s": complete_s})


def bench_ledger(args) -> list[dict]:
    from vidgen.queue.ledger import JobSpec, Ledger

    rows = []
    ctx = mp.get_context("spawn")
    for procs in args.procs:
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            path = str(Path(tmp) / "queue.db")
            led = Ledger(path)
            specs = [JobSpec(kind="render", payload={"prompt": f"shot {i}", "seed": i, "size": "1280x720"},
                             name=f"shot{i}", priority=i % 3, output=f"out/{i}.mp4") for i in range(args.jobs)]
            t0 = time.perf_counter()
            for i in range(0, len(specs), args.batch):
                led.submit(specs[i:i + args.batch])
            submit_s = time.perf_counter() - t0

            barrier, results = ctx.Barrier(procs + 1), ctx.Queue()
            workers = [ctx.Process(target=_claimer, args=(path, f"w{n}", args.work_ms / 1000, barrier, results))
                       for n in range(procs)]
            for w in workers:
                w.start()
            barrier.wait()                                  # every process has imported and opened the ledger
            start = time.monotonic()
            out = [results.get(timeout=600) for _ in workers]
            for w in workers:
                w.join()
            wall = max(r["end"] for r in out) - start

            claimed = [i for r in out for i in r["claimed"]]
            once = len(claimed) == args.jobs and len(set(claimed)) == args.jobs
            integrity = led.integrity_check()
            led.close()
            claim_lat = [t for r in out for t in r["claim_s"]]
            complete_lat = [t for r in out for t in r["complete_s"]]
            row = {"procs": procs, "jobs": args.jobs, "submit_batch": args.batch,
                   "submit_jobs_per_s": args.jobs / submit_s, "wall_s": wall, "claims_per_s": args.jobs / wall,
                   "each_claimed_once": once, "integrity": integrity,
                   "per_process": sorted(len(r["claimed"]) for r in out), "work_ms": args.work_ms,
                   "claim_ms_p50": 1000 * statistics.median(claim_lat),
                   "claim_ms_p99": 1000 * _percentile(claim_lat, 0.99),
                   "complete_ms_p50": 1000 * statistics.median(complete_lat),
                   "complete_ms_p99": 1000 * _percentile(complete_lat, 0.99)}
            rows.append(row)
            verdict = "" if procs != 4 else ("  (target >= 500: met)" if row["claims_per_s"] >= 500
                                              else "  (target >= 500: MISSED)")
            print(f"{procs} process{'es' if procs > 1 else ''}: {row['claims_per_s']:7.0f} claims/s "
                  f"(claim+complete each; {args.jobs} jobs in {wall:.2f} s; per process {row['per_process']}; "
                  f"claim p50/p99 {row['claim_ms_p50']:.2f}/{row['claim_ms_p99']:.1f} ms; "
                  f"complete p50/p99 {row['complete_ms_p50']:.2f}/{row['complete_ms_p99']:.1f} ms; "
                  f"each claimed once: {once}; integrity: {integrity}){verdict}")
            print(f"   submit: {row['submit_jobs_per_s']:7.0f} jobs/s in batches of {args.batch}")
            if not once or integrity != "ok":
                raise SystemExit("the ledger lost or duplicated a job, or is corrupt")
    return rows


def bench_render(args) -> list[dict]:
    """A queued render vs a direct one of the same config, in this process, alternating."""
    from vidgen.pipeline import render
    from vidgen.queue.executor import Executor
    from vidgen.queue.ledger import Ledger
    from vidgen.queue.workflow import plan_single

    tmp = Path(tempfile.mkdtemp(prefix="vidgen-bench-queue-"))
    overrides = ["num_frames=33", f"sampling.steps={args.steps}", "seed=3"]
    direct, queued = [], []
    render(str(ROOT / "configs" / "demo.yaml"), overrides=[*overrides, f"output.path={tmp / 'warm.mp4'}",
                                                          "sampling.steps=2"])       # imports, first-call costs
    def run_direct(rep: int) -> float:
        out = tmp / f"direct-{rep}.mp4"
        t0 = time.perf_counter()
        render(str(ROOT / "configs" / "demo.yaml"), overrides=[*overrides, f"output.path={out}"])
        return time.perf_counter() - t0

    def run_queued(rep) -> float:
        out = tmp / f"queued-{rep}.mp4"
        t0 = time.perf_counter()           # submit, claim, run with heartbeats, complete; a fresh worker each time
        ledger = Ledger(tmp / "q.db")
        ledger.submit(plan_single(ROOT / "configs" / "demo.yaml", [*overrides, f"output.path={out}"]))
        ex = Executor(ledger, "bench", lease_s=60)
        job = ledger.claim("bench", 60)
        assert ex.execute(job) == "succeeded"
        return time.perf_counter() - t0

    for rep in range(args.reps):        # alternate which goes first, so neither gains from the order
        if rep % 2:
            queued.append(run_queued(rep))
            direct.append(run_direct(rep))
        else:
            direct.append(run_direct(rep))
            queued.append(run_queued(rep))
        print(f"rep {rep}: direct {direct[-1]:.2f} s, queued {queued[-1]:.2f} s")
    d, q = statistics.median(direct), statistics.median(queued)
    paired = statistics.median(b - a for a, b in zip(direct, queued))
    # The queue's own fixed cost, without the render: submit, claim, heartbeat thread, the job's
    # config check, complete (the render kind replaced by the config check it starts with).
    from vidgen.presets import load_config
    from vidgen.queue import executor as E

    real = E.KINDS["render"]
    E.KINDS["render"] = lambda ex, job: (load_config(job.payload).output.path, {})
    fixed = []
    try:
        for rep in range(20):
            fixed.append(run_queued(f"fixed-{rep}"))
    finally:
        E.KINDS["render"] = real
    f = statistics.median(fixed)
    row = {"direct_s": d, "queued_s": q, "overhead_of_medians": (q - d) / d, "paired_median_diff_s": paired,
           "fixed_queue_cost_s": f, "fixed_cost_share": f / d, "direct": direct, "queued": queued,
           "config": "configs/demo.yaml " + " ".join(overrides)}
    print(f"median: direct {d:.2f} s, queued {q:.2f} s ({row['overhead_of_medians']:+.1%}); paired difference "
          f"{paired:+.2f} s; the queue's fixed cost {f * 1000:.0f} ms = {f / d:.1%} of a direct render")
    return [row]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common = argparse.ArgumentParser(add_help=False)       # options every subcommand takes
    common.add_argument("--json", help="write the rows here")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("ledger", parents=[common], help="SQLite ledger throughput: submit, claim, complete")
    p.add_argument("--jobs", type=int, default=2000, help="jobs per run")
    p.add_argument("--procs", type=int, nargs="+", default=[1, 4], help="claiming processes, one run each")
    p.add_argument("--batch", type=int, default=100, help="jobs per submit() transaction")
    p.add_argument("--work-ms", type=float, default=0.0, help="simulated work between claim and complete")
    p.add_argument("--dir", help="folder for the temporary ledger (default: the system's temp folder)")
    p.set_defaults(run=bench_ledger)
    p = sub.add_parser("render", parents=[common], help="a queued render vs a direct render of the same config")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--steps", type=int, default=600, help="sampling steps (600: about 10 s a render on 2 cores)")
    p.set_defaults(run=bench_render)
    args = parser.parse_args()
    rows = args.run(args)
    if args.json:
        meta = {"sqlite": sqlite3.sqlite_version, "python": platform.python_version(), "cpus": os.cpu_count()}
        Path(args.json).write_text(json.dumps({**meta, args.command: rows}, indent=2))


if __name__ == "__main__":
    main()
