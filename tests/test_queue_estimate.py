"""The film's cost at submit (vidgen.queue.estimate): learned from the ledger's finished renders, each shot
predicted from its counted work, the film laid out on the workers; `submit --estimate` queues nothing.
(How close it comes is a benchmark: bench/estimate.py.)"""

from __future__ import annotations

import json

import pytest

from vidgen.cli import main
from vidgen.queue import api
from vidgen.queue.estimate import Sample, calibrate, estimate, fit, held_out_error
from vidgen.queue.ledger import Ledger
from vidgen.queue.worker import run_worker


def test_rates_come_from_the_samples_and_the_error_is_held_out():
    samples = [Sample("v/cpu", 100.0, 10.0, 1.0, 0.1, 1.6), Sample("v/cpu", 200.0, 10.0, 2.0, 0.1, 2.6),
               Sample("v/cpu", 300.0, 20.0, 3.0, 0.2, 3.7)]
    model = fit(samples)
    assert model.rates["v/cpu"] == pytest.approx((0.01, 0.01, 0.5))
    assert abs(model.predict("v/cpu", 400.0, 20.0) - 4.7) < 1e-9
    assert model.predict("other/cpu", 100.0, 10.0) == model.predict("v/cpu", 100.0, 10.0)    # the overall rates
    assert 0 < held_out_error(model) < 10


@pytest.mark.slow
def test_submit_estimate_learns_from_the_ledger_and_queues_nothing(base_cfg, tmp_path, capsys):
    db = tmp_path / "q.db"
    for seed in (1, 2):
        cfg = base_cfg(seed=seed, output={"path": str(tmp_path / f"c{seed}.mp4")})
        (tmp_path / f"c{seed}.json").write_text(json.dumps(cfg))
        api.submit(db, tmp_path / f"c{seed}.json")
    run_worker(db, exit_when_idle=True, lease_s=30)
    ledger = Ledger(db)
    model = calibrate(ledger)
    assert len(model.samples) == 2 and model.load_s >= 0 and model.samples[0].key.endswith("/cpu")
    cfg = base_cfg(seed=3, num_frames=17, output={"path": str(tmp_path / "c3.mp4")})
    (tmp_path / "c3.json").write_text(json.dumps(cfg))
    specs = api.plan(tmp_path / "c3.json")
    est = estimate(specs, model, 1)
    assert est["learned_from"] == 2 and est["jobs"][0]["seconds"] > 0
    assert est["wall_seconds"] >= est["jobs"][0]["seconds"]
    assert main(["queue", "--db", str(db), "submit", "--estimate", str(tmp_path / "c3.json")]) == 0
    out = capsys.readouterr().out
    assert "learned from 2 finished render(s)" in out and "whole film:" in out
    assert len(ledger.jobs()) == 2 and not (tmp_path / "c3.mp4").exists()


def test_with_nothing_finished_the_estimate_says_so(base_cfg, tmp_path, capsys):
    cfg = base_cfg(output={"path": str(tmp_path / "c.mp4")})
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    assert main(["queue", "--db", str(tmp_path / "q.db"), "submit", "--estimate", str(tmp_path / "c.json")]) == 0
    assert "no finished renders in this ledger to learn from" in capsys.readouterr().out


def test_the_service_estimates_a_submission(base_cfg, tmp_path):
    """POST /api/estimate (the page's Estimate button): planned and checked as a submit, nothing queued."""
    from starlette.testclient import TestClient

    from vidgen.queue.service import create_app

    cfg = base_cfg(output={"path": str(tmp_path / "c.mp4")})
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    model = cfg["model"]["path"]
    with TestClient(create_app(tmp_path / "q.db", roots=[tmp_path, model]), base_url="http://127.0.0.1") as client:
        r = client.post("/api/estimate", json={"config": str(tmp_path / "c.json")})
        assert r.status_code == 200 and r.json()["known"] is False and r.json()["jobs"][0]["kind"] == "render"
        r = client.post("/api/estimate", json={"config": str(tmp_path / "c.json"), "workflow": "x"})
        assert r.status_code == 422 and "give" in r.json()["problems"][0]
        assert client.get("/api/jobs").json()["jobs"] == []
