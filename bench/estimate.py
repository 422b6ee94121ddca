"""How good `vidgen queue submit --estimate` is: calibrate on the demo workflows, predict a second run
with other seeds, run it, and compare the predicted wall time with the measured one.

    python bench/estimate.py                  # demo-shapes and demo-story, one CPU worker

Runs in a scratch folder (the repository's configs/, samples/ and workflows/ linked in), one worker
process (`vidgen queue worker --exit-when-idle`) per run, as a farm runs them, the demo models on the
CPU. The film's wall time is measured in the ledger, from its first job's start to its last job's end.
Prints per workflow the prediction, the measurement and the error.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORKFLOWS = ("demo-shapes.yaml", "demo-story.yaml")


def _worker(db: Path) -> None:
    subprocess.run([sys.executable, "-m", "vidgen", "queue", "--db", str(db), "worker", "--exit-when-idle"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    from vidgen.queue import api
    from vidgen.queue.estimate import calibrate, estimate, report
    from vidgen.queue.ledger import Ledger

    with tempfile.TemporaryDirectory() as tmp:
        for name in ("configs", "samples", "workflows"):
            (Path(tmp) / name).symlink_to(ROOT / name)
        os.chdir(tmp)
        db = Path(tmp) / "q.db"
        ledger = Ledger(db)
        for wf in WORKFLOWS:                        # the calibration run
            api.submit(ledger, f"workflows/{wf}")
        _worker(db)
        print(f"calibration: {len(ledger.jobs())} jobs")
        for n, wf in enumerate(WORKFLOWS):
            model = calibrate(ledger)
            doc = yaml.safe_load((ROOT / "workflows" / wf).read_text())     # the same film, other seeds, its own folder
            doc["output_dir"] = f"outputs/second-{n}"
            for shot in doc["shots"]:
                shot["seed"] = int(shot.get("seed") or 0) + 1000
            second = Path(tmp) / f"second-{wf}"
            second.write_text(yaml.safe_dump(doc))
            specs = api.plan(second)
            api.check_specs(specs)
            est = estimate(specs, model, 1)
            print(report(est))
            ids = api.submit_specs(ledger, specs)
            _worker(db)
            jobs = [ledger.get(i) for i in ids]
            measured = max(j.finished for j in jobs) - min(j.started for j in jobs)     # the film's time in the queue
            err = 100 * (est["wall_seconds"] - measured) / measured
            print(f"{wf}: predicted {est['wall_seconds']:.1f} s, measured {measured:.1f} s, error {err:+.0f}% "
                  f"(learned from {est['learned_from']} renders, held-out error {est['held_out_error_pct']:.0f}%)")


if __name__ == "__main__":
    main()
