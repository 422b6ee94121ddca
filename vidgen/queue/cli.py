"""`vidgen queue ...`: submit, list, show, logs, cancel, retry, pause, resume, approve, reroll, reject, worker,
serve (thin, over the API).

The ledger's path: --db, else $VIDGEN_QUEUE, else vidgen's file in the user's data directory.
"""

from __future__ import annotations

import json
import os
import sys
import time

from ..errors import InputError
from ..quiet import libraries
from . import api
from .ledger import default_path
from .schedule import unplaceable

TERMINAL = ("succeeded", "failed", "canceled", "blocked-by-guard", "awaiting_review")     # logs -f stops there


def _ledger(args):
    return api.open_ledger(args.db)


def _bar(job) -> str:
    p = job.progress or {}
    total, step = p.get("total") or 0, p.get("step") or 0
    if job.state.value != "running" or not total:
        return ""
    filled = int(20 * step / total)
    eta = p.get("eta_s")
    return f"[{'#' * filled}{'.' * (20 - filled)}] {p.get('stage', '')} {step}/{total}" + \
        (f" ETA {eta:.0f}s" if eta is not None else "")


def cmd_submit(args) -> int:
    specs = api.plan(args.file, args.overrides)     # a config error costs no model library import
    if any(spec.kind == "render" for spec in specs):
        libraries(args)                            # a render's checks before queueing read its model folder
    if args.estimate:                               # checked as a submit would be; nothing queued
        from .estimate import calibrate, estimate, report

        api.check_specs(specs)
        ledger = _ledger(args)
        print(report(estimate(specs, calibrate(ledger), len(ledger.live_workers()) or 1)))
        return 0
    ids = api.submit_specs(args.db, specs)          # a blocked prompt: exit 3, nothing queued
    for i, spec in zip(ids, specs):
        print(f"#{i} {spec.kind} {spec.name or ''} -> {spec.output or ''}".rstrip())
    return 0


def cmd_list(args) -> int:
    jobs = api.jobs(_ledger(args), args.state)
    if args.json:
        print(json.dumps([j.to_dict() for j in jobs], indent=2, default=str))
        return 0
    width = min(48, max((len(j.name) for j in jobs), default=0))     # names in full up to 48 characters
    workers = _ledger(args).live_workers() if any(j.needs for j in jobs) else []
    for j in jobs:
        stuck = unplaceable(j.needs, workers) if j.state.value == "queued" else None
        extra = _bar(j) or (j.error or "")[:80] or (f"waits: {stuck}" if stuck else "")
        print(f"#{j.id:<5} {j.state.value:<17} {j.kind:<13} {j.name[:width]:<{width}} "
              f"attempts {j.attempts}/{j.max_attempts}  {extra}  {j.output or ''}".rstrip())
    return 0


def cmd_show(args) -> int:
    print(json.dumps(api.get(_ledger(args), args.id).to_dict(), indent=2, default=str))
    return 0


def cmd_logs(args) -> int:
    ledger = _ledger(args)
    seen = 0
    while True:
        lines = api.logs(ledger, args.id)
        for attempt, t, text in lines[seen:]:
            print(f"[attempt {attempt} {time.strftime('%H:%M:%S', time.localtime(t))}] {text}")
        seen = len(lines)
        if not args.follow or api.get(ledger, args.id).state.value in TERMINAL:
            return 0
        sys.stdout.flush()
        time.sleep(1.0)


def cmd_cancel(args) -> int:
    state = api.cancel(_ledger(args), args.id)
    print(f"#{args.id}: {'cancel requested (it stops at its next step)' if state.value == 'running' else state.value}")
    return 0


def cmd_retry(args) -> int:
    api.retry(_ledger(args), args.id)
    print(f"#{args.id}: queued again")
    return 0


def cmd_pause(args) -> int:
    api.pause(_ledger(args), args.id)
    print("queue paused" if args.id is None else f"#{args.id}: paused (a running job pauses at its next step)")
    return 0


def cmd_resume(args) -> int:
    what = api.resume(_ledger(args), args.id)
    print(what if args.id is None else f"#{args.id}: {what}")
    return 0


def cmd_approve(args) -> int:
    api.approve(_ledger(args), args.id, args.take)
    print(f"#{args.id}: take {args.take} approved; its full decode is queued, then what follows the shot")
    return 0


def cmd_reroll(args) -> int:
    new = api.reroll(_ledger(args), args.id, args.seed)
    print(f"#{args.id}: take added as job #{new}; the shot waits for it")
    return 0


def cmd_reject(args) -> int:
    api.reject(_ledger(args), args.id, args.reason)
    print(f"#{args.id}: rejected; the jobs that depend on it fail")
    return 0


def cmd_serve(args) -> int:
    from .service import serve      # the `serve` extra

    db = args.serve_db or args.db or default_path()
    print(f"vidgen queue service on http://{args.host}:{args.port}/ (ledger {db})", flush=True)
    serve(db, host=args.host, port=args.port, roots=args.root or [], token=args.token)
    return 0


def _devices(given: str) -> list[str]:
    """CUDA_VISIBLE_DEVICES for each worker of `--devices`: GPU indices as this process sees them
    (through its own CUDA_VISIBLE_DEVICES, if set), "" for `cpu`. GPUs that are not there are refused:
    their workers would run on the CPU without a word."""
    devices = [d.strip() for d in given.split(",")]
    if bad := [d for d in devices if d != "cpu" and not d.isdigit()]:
        raise InputError(f"--devices {given}: {bad[0]!r} is not a GPU index (0, 1, ...) or cpu")
    gpus = [int(d) for d in devices if d != "cpu"]
    if gpus:
        import torch

        n = torch.cuda.device_count()
        if n == 0:
            raise InputError(f"--devices {given}: this machine has no CUDA GPU (torch sees none), so these workers "
                             f"would run on the CPU; for CPU workers say so: --devices {','.join(['cpu'] * len(devices))}")
        if missing := [i for i in gpus if i >= n]:
            raise InputError(f"--devices {given}: there is no GPU {missing[0]} (torch sees {n}: "
                             f"{', '.join(map(str, range(n)))})")
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return ["" if d == "cpu" else visible[int(d)] if visible else d for d in devices]


def cmd_worker(args) -> int:
    db = args.db or default_path()
    if args.backend == "ray":
        from .ray_backend import run_ray_dispatcher

        run_ray_dispatcher(db, address=args.address, num_actors=args.actors, exit_when_idle=args.exit_when_idle,
                           lease_s=args.lease, facts=_facts(args) if args.device_budget or args.host_budget else None)
        return 0
    if args.gpus:           # one worker holding several devices: a parallel render's ranks
        if args.devices:
            raise InputError("--gpus and --devices: give one (--gpus 0,1: one worker on both; --devices 0,1: one each)")
        gpus = _devices(args.gpus)
        if all(gpus):
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        elif any(gpus):
            raise InputError(f"--gpus {args.gpus}: all GPUs or all cpu (a parallel render's ranks are of one kind)")
        from .worker import run_worker

        run_worker(db, exit_when_idle=args.exit_when_idle, lease_s=args.lease, devices=len(gpus), facts=_facts(args))
        return 0
    devices = _devices(args.devices) if args.devices else []
    if len(devices) > 1:
        from .worker import run_device_workers

        rest = (["--exit-when-idle"] if args.exit_when_idle else []) + ["--lease", str(args.lease)]
        rest += [a for k in ("device_budget", "host_budget") if getattr(args, k)
                 for a in (f"--{k.replace('_', '-')}", getattr(args, k))]
        return run_device_workers(db, devices, rest)
    if devices:
        os.environ["CUDA_VISIBLE_DEVICES"] = devices[0]
    elif args.device and args.device.startswith("cuda:"):
        os.environ["CUDA_VISIBLE_DEVICES"] = _devices(args.device.removeprefix("cuda:"))[0]
    from .worker import run_worker

    run_worker(db, exit_when_idle=args.exit_when_idle, lease_s=args.lease, facts=_facts(args))
    return 0


def _facts(args):
    """What this worker declares it has (vidgen.queue.schedule), or None when it says nothing (it then
    claims any job, as before): --device measures the device's free memory and the host's, the budgets
    say them."""
    if not (args.device or args.device_budget or args.host_budget):
        return None
    from ..budgets import parse_budget
    from .schedule import WorkerFacts

    kind = (args.device or "cuda").split(":")[0]
    if kind not in ("cuda", "cpu"):
        raise InputError(f"--device {args.device}: give cuda, cuda:N or cpu")
    import torch

    from ..memory import _auto_device_budget, _auto_host_budget

    if kind == "cuda" and not args.device_budget and not torch.cuda.is_available():
        raise InputError("--device cuda: this machine has no CUDA GPU (torch sees none); give --device-budget "
                         "to declare one, or --device cpu")
    device = parse_budget(args.device_budget, "--device-budget") if args.device_budget else (
        _auto_device_budget(torch.device("cuda", 0)) if kind == "cuda" else None)
    host = parse_budget(args.host_budget, "--host-budget") if args.host_budget else _auto_host_budget()
    return WorkerFacts(kind, device, host)


def add_queue_parser(sub) -> None:
    p = sub.add_parser("queue", help="the render queue: submit workflows and renders, run workers")
    p.add_argument("--db", help="ledger file (default: $VIDGEN_QUEUE, else vidgen's file in your data directory)")
    q = p.add_subparsers(dest="queue_command", required=True)
    s = q.add_parser("submit", help="validate a workflow (or a render config) and queue its jobs")
    s.add_argument("file")
    s.add_argument("overrides", nargs="*", help="KEY=VALUE for every shot (render config keys)")
    s.add_argument("--estimate", action="store_true", help="queue nothing: predict each shot's GPU-seconds and the "
                                                           "film's wall time, learned from this ledger's finished renders")
    s.set_defaults(fn=cmd_submit)
    s = q.add_parser("list", help="jobs with state, progress and ETA")
    s.add_argument("--state", help="only jobs in this state")
    s.add_argument("--json", action="store_true", help="a JSON array of jobs")
    s.set_defaults(fn=cmd_list)
    for name, fn, text in (("show", cmd_show, "one job as JSON"), ("cancel", cmd_cancel, "cancel a job"),
                           ("retry", cmd_retry, "queue a failed, canceled or blocked job again; a finished one runs again, "
                                               "and what follows it (its files set aside)")):
        s = q.add_parser(name, help=text)
        s.add_argument("id", type=int)
        s.set_defaults(fn=fn)
    s = q.add_parser("logs", help="a job's log, every attempt")
    s.add_argument("id", type=int)
    s.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    s.set_defaults(fn=cmd_logs)
    for name, fn, text in (("pause", cmd_pause, "pause a job, or the whole queue"),
                           ("resume", cmd_resume, "resume a job, or the whole queue")):
        s = q.add_parser(name, help=text)
        s.add_argument("id", type=int, nargs="?")
        s.set_defaults(fn=fn)
    s = q.add_parser("approve", help="approve a take of a shot awaiting review (docs/queue.md#takes-and-review)")
    s.add_argument("id", type=int)
    s.add_argument("take", type=int, help="the take's number (1 is the first)")
    s.set_defaults(fn=cmd_approve)
    s = q.add_parser("reroll", help="add a take to a shot awaiting review")
    s.add_argument("id", type=int)
    s.add_argument("--seed", type=int, help="its seed (default: one past the highest so far)")
    s.set_defaults(fn=cmd_reroll)
    s = q.add_parser("reject", help="reject a shot in review: the jobs that depend on it fail")
    s.add_argument("id", type=int)
    s.add_argument("--reason", default="rejected", help="why (recorded, and in the dependents' errors)")
    s.set_defaults(fn=cmd_reject)
    s = q.add_parser("serve", help="the HTTP API and web page over the ledger (docs/queue.md)")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (another than loopback needs --token)")
    s.add_argument("--port", type=int, default=8765)
    s.add_argument("--root", action="append", help="a folder submitted configs may read and write in (repeatable; "
                                                   "default: the current directory)")
    s.add_argument("--token", help="every request must carry it (default: $VIDGEN_TOKEN)")
    s.add_argument("--db", dest="serve_db", help="the ledger file (the same as `vidgen queue --db` before serve)")
    s.set_defaults(fn=cmd_serve)
    s = q.add_parser("worker", help="run jobs until stopped (SIGTERM: finish the step, checkpoint, release)")
    s.add_argument("--devices", help="GPU indices, e.g. 0,1: one worker process per device (cpu,cpu: two on the CPU)")
    s.add_argument("--gpus", help="GPU indices, e.g. 0,1,2,3: one worker holding them all, for renders that ask for "
                                  "several (parallel.devices); cpu,cpu: two CPU ranks (tests)")
    s.add_argument("--device", help="cuda, cuda:N or cpu: the device this worker renders on; its free memory (and "
                                    "the host's) is measured, and only jobs whose memory plan fits are claimed")
    s.add_argument("--device-budget", help="the device memory to declare (e.g. 24GiB) instead of measuring it")
    s.add_argument("--host-budget", help="the host memory to declare (e.g. 64GiB) instead of measuring it")
    s.add_argument("--exit-when-idle", action="store_true", help="exit when no job is left to run")
    s.add_argument("--lease", type=float, default=60.0, help="job lease in seconds, renewed by heartbeats")
    s.add_argument("--backend", choices=["local", "ray"], default="local")
    s.add_argument("--address", help="Ray cluster address (--backend ray); default: start a local one")
    s.add_argument("--actors", type=int, default=None, help="Ray actors (default: one per GPU, else 1)")
    s.set_defaults(fn=cmd_worker)
