"""The queue service under load, against a live `vidgen queue serve` (uvicorn, as users run it):

1. 1,000 queued jobs: the time of `GET /api/jobs` (median and worst of 20), and, where Debian's
   Chromium and its driver are installed, the page with all of them: the time until the table
   shows 1,000 rows and the time one redraw of the table takes in the browser (median of 20);
2. 50 concurrent server-sent-event clients while 3 workers render demo jobs: every client must see
   every job reach `succeeded`; `GET /api/jobs` timed while they listen.

    python bench/queue_service.py [--jobs 1000] [--clients 50] [--workers 3] [--renders 6]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vidgen.queue.ledger import JobSpec, Ledger  # noqa: E402


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(out: Path, seed: int, steps: int = 10) -> dict:
    return {"model": {"path": str(ROOT / "samples" / "demo-wan"), "device": "cpu", "max_sequence_length": 16},
            "prompt": "a red circle moving right on a black background", "seed": seed, "size": "64x64",
            "num_frames": 17, "fps": 8, "sampling": {"steps": steps}, "output": {"path": str(out / f"clip-{seed}.mp4")}}


def _serve(db: Path, root: Path) -> tuple[subprocess.Popen, str]:
    port = _port()
    proc = subprocess.Popen([sys.executable, "-m", "vidgen", "queue", "--db", str(db), "serve", "--port", str(port),
                             "--root", str(root), "--root", str(ROOT)], cwd=root, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            urllib.request.urlopen(base + "/api/jobs", timeout=5).read()
            return proc, base
        except OSError:
            time.sleep(0.1)
    raise SystemExit("the service did not start")


def _time_list(base: str, n: int = 20) -> tuple[list[float], int]:
    """n timed GET /api/jobs (ms), after one untimed (the service's first request warms its imports)."""
    urllib.request.urlopen(base + "/api/jobs", timeout=30).read()
    times, count = [], 0
    for _ in range(n):
        t0 = time.perf_counter()
        with urllib.request.urlopen(base + "/api/jobs", timeout=30) as r:
            count = len(json.loads(r.read())["jobs"])
        times.append((time.perf_counter() - t0) * 1000)
    return times, count


def _page(base: str, jobs: int) -> dict | None:
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver_path):
        return None
    from selenium import webdriver
    from selenium.webdriver.common.by import By

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1200,800"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=driver_path), options=options)
    try:
        t0 = time.perf_counter()
        driver.get(base + "/")
        while len(driver.find_elements(By.CSS_SELECTOR, "#jobs tbody tr[data-id]")) < jobs:
            time.sleep(0.02)
        shown = (time.perf_counter() - t0) * 1000
        redraws = [driver.execute_script("const t = performance.now(); render(); return performance.now() - t;")
                   for _ in range(20)]
        return {"table_shown_ms": shown, "redraw_ms_median": statistics.median(redraws), "redraw_ms_max": max(redraws)}
    finally:
        driver.quit()


def listing(n_jobs: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ledger = Ledger(root / "q.db")
        ledger.submit([JobSpec(kind="render", payload=_config(root / "out", i), name=f"shot-{i:04d}",
                               output=str(root / "out" / f"clip-{i}.mp4"), priority=i % 7) for i in range(n_jobs)])
        proc, base = _serve(root / "q.db", root)
        try:
            times, count = _time_list(base)
            page = _page(base, n_jobs)
        finally:
            proc.kill()
    return {"jobs": count, "list_ms_median": statistics.median(times), "list_ms_p95": sorted(times)[int(0.95 * len(times))],
            "list_ms_max": max(times), "page": page}


def under_load(clients: int, workers: int, renders: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        db = root / "q.db"
        ledger = Ledger(db)
        ids = ledger.submit([JobSpec(kind="render", payload=_config(root / "out", i), name=f"shot-{i}",
                                     output=str(root / "out" / f"clip-{i}.mp4")) for i in range(renders)])
        proc, base = _serve(db, root)
        seen = [dict() for _ in range(clients)]          # per client: job id -> last state seen
        events = [0] * clients
        opened = threading.Barrier(clients + 1)

        def listen(k: int) -> None:
            with urllib.request.urlopen(base + "/api/events", timeout=600) as stream:
                opened.wait()
                kind = None
                for raw in stream:
                    line = raw.decode().strip()
                    if line.startswith("event: "):
                        kind = line[7:]
                    elif line.startswith("data: ") and kind == "job":
                        job = json.loads(line[6:])
                        seen[k][job["id"]] = job["state"]
                        events[k] += 1
                        if all(seen[k].get(i) == "succeeded" for i in ids):
                            return

        threads = [threading.Thread(target=listen, args=(k,), daemon=True) for k in range(clients)]
        for t in threads:
            t.start()
        opened.wait(timeout=60)
        env = {**os.environ, "VIDGEN_QUEUE": str(db)}
        t0 = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-m", "vidgen", "queue", "--db", str(db), "worker", "--exit-when-idle"],
                                  cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for _ in range(workers)]
        lists = []
        while any(p.poll() is None for p in procs):
            lists += _time_list(base, 1)[0]
            time.sleep(0.5)
        for t in threads:
            t.join(timeout=60)
        wall = time.perf_counter() - t0
        proc.kill()
        complete = sum(all(s.get(i) == "succeeded" for i in ids) for s in seen)
    return {"clients": clients, "workers": workers, "renders": renders, "wall_s": wall,
            "clients_that_saw_every_job_succeed": complete, "events_per_client_min": min(events),
            "events_per_client_max": max(events), "list_ms_median_during": statistics.median(lists),
            "list_ms_max_during": max(lists)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--renders", type=int, default=6)
    args = ap.parse_args()
    a = listing(args.jobs)
    print(f"listing: {a['jobs']} jobs, GET /api/jobs median {a['list_ms_median']:.1f} ms, "
          f"p95 {a['list_ms_p95']:.1f} ms, worst {a['list_ms_max']:.1f} ms (of 20)")
    if a["page"]:
        p = a["page"]
        print(f"page: table of {args.jobs} rows shown {p['table_shown_ms']:.0f} ms after load; one redraw "
              f"median {p['redraw_ms_median']:.1f} ms, worst {p['redraw_ms_max']:.1f} ms")
    else:
        print("page: not measured (needs chromium and chromium-driver)")
    b = under_load(args.clients, args.workers, args.renders)
    print(f"events: {b['clients']} SSE clients, {b['workers']} workers, {b['renders']} renders in {b['wall_s']:.1f} s: "
          f"{b['clients_that_saw_every_job_succeed']}/{b['clients']} clients saw every job succeed "
          f"({b['events_per_client_min']}-{b['events_per_client_max']} job events each); GET /api/jobs meanwhile "
          f"median {b['list_ms_median_during']:.1f} ms, worst {b['list_ms_max_during']:.1f} ms")
    print(json.dumps({"listing": a, "events": b}))


if __name__ == "__main__":
    main()
