"""The queue service: every endpoint through Starlette's test client, every bad input, the token."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")

from starlette.testclient import TestClient  # noqa: E402

from vidgen.queue.ledger import Ledger  # noqa: E402
from vidgen.queue.service import create_app  # noqa: E402


@pytest.fixture
def service(tiny_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = {"model": {"path": str(tiny_model()), "device": "cpu"}, "prompt": "a red circle moving right",
           "size": "64x64", "num_frames": 5, "fps": 8, "sampling": {"steps": 2},
           "output": {"path": str(tmp_path / "out" / "clip-{seed}.mp4")}}
    (tmp_path / "render.json").write_text(json.dumps(cfg))
    db = tmp_path / "q.db"

    def make(**kw):
        return TestClient(create_app(db, roots=[tmp_path, Path(tiny_model()).parent], **kw)), cfg
    return make


def _submit(client, body, status=201):
    r = client.post("/api/jobs", json=body)
    assert r.status_code == status, r.text
    return r.json()


def test_submit_list_get_logs_and_actions(service, tmp_path):
    client, cfg = service()
    ids = _submit(client, {"config": "render.json", "overrides": ["seed=3"]})["ids"]
    ids += _submit(client, {"config": {**cfg, "seed": 4}})["ids"]
    listed = client.get("/api/jobs").json()
    assert [j["id"] for j in listed["jobs"]] == ids and listed["paused"] is False
    assert {j["state"] for j in listed["jobs"]} == {"queued"}
    job = client.get(f"/api/jobs/{ids[0]}").json()
    assert job["payload"]["seed"] == 3 and job["attempt_history"] == [] and job["progress"]["step"] is None
    assert client.get("/api/jobs", params={"state": "queued"}).json()["jobs"]
    assert client.get("/api/jobs", params={"state": "bogus"}).status_code == 422
    # Reorder: the second job first.
    assert client.patch(f"/api/jobs/{ids[1]}", json={"priority": 5}).json()["priority"] == 5
    assert Ledger(tmp_path / "q.db").claim("w", 60).id == ids[1]
    # Edit a queued job's prompt and seed (re-validated); a running one cannot be edited.
    edited = client.patch(f"/api/jobs/{ids[0]}", json={"prompt": "a blue square moving up", "seed": 9})
    assert edited.status_code == 200, edited.text
    assert client.get(f"/api/jobs/{ids[0]}").json()["payload"]["prompt"] == "a blue square moving up"
    assert client.patch(f"/api/jobs/{ids[1]}", json={"seed": 1}).status_code == 409
    bad = client.patch(f"/api/jobs/{ids[0]}", json={"overrides": ["sampling.steps=0"]})
    assert bad.status_code == 422 and "sampling.steps" in bad.text
    # Actions, each logged with the client's address.
    assert client.post(f"/api/jobs/{ids[0]}/pause").json()["state"] == "paused"
    assert client.post(f"/api/jobs/{ids[0]}/resume").json()["state"] == "queued"
    assert client.post(f"/api/jobs/{ids[0]}/cancel").json()["state"] == "canceled"
    assert client.post(f"/api/jobs/{ids[0]}/retry").json()["state"] == "queued"
    texts = [line["text"] for line in client.get(f"/api/jobs/{ids[0]}/logs").json()["logs"]]
    assert any("cancel by testclient" in t for t in texts) and any("submitted" in t for t in texts)
    assert client.post(f"/api/jobs/{ids[0]}/explode").status_code == 404
    assert client.post(f"/api/jobs/{ids[1]}/retry").status_code == 409         # running: nothing to retry
    assert client.post("/api/queue/pause").json() == {"paused": True}
    assert client.post("/api/queue/resume").json() == {"paused": False}
    assert client.get(f"/api/jobs/{ids[0]}/preview").status_code == 404          # nothing rendered yet
    page = client.get("/")
    assert page.status_code == 200 and "/static/app.js" in page.text
    assert client.get("/static/app.js").status_code == 200
    assert "access-control-allow-origin" not in {k.lower() for k in page.headers}


def test_bad_input(service, tmp_path):
    client, cfg = service(max_body=4096)
    assert client.get("/api/jobs/999").status_code == 404
    assert client.post("/api/jobs/999/cancel").status_code == 404
    assert client.get("/api/jobs/999/logs").status_code == 404
    r = client.post("/api/jobs", json={"config": {**cfg, "sampling": {"steps": 0, "solver": "magic"}, "fps": -1}})
    assert r.status_code == 422 and len(r.json()["problems"]) >= 3, r.text
    r = client.post("/api/jobs", json={"config": {**cfg, "prompt": "a p.o.r.n scene", "guard": {"enabled": True,
                                                                                                   "frames": False}}})
    assert r.status_code == 403 and r.json()["rule"] == "explicit", r.text
    r = client.post("/api/jobs", json={"config": {**cfg, "output": {"path": "/tmp/elsewhere/x.mp4"}}})
    assert r.status_code == 422 and "outside the service's roots" in r.text
    r = client.post("/api/jobs", json={"config": "/etc/passwd"})
    assert r.status_code == 422 and "outside" in r.text
    r = client.post("/api/jobs", json={"config": {**cfg, "negative_prompt": "x" * 8000}})
    assert r.status_code == 413
    assert client.post("/api/jobs", content=b"not json", headers={"content-type": "application/json"}).status_code == 422
    assert client.post("/api/jobs", json={"both": 1}).status_code == 422
    assert client.get("/api/jobs").json()["jobs"] == []                # nothing was queued by any of it


def test_token(service, tmp_path):
    client, cfg = service(token="s3cret")
    assert client.get("/api/jobs").status_code == 401
    assert client.get("/api/jobs", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert client.get("/api/jobs", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    page = client.get("/", follow_redirects=False)
    assert page.status_code == 303 and page.headers["location"] == "/login"
    assert client.post("/login", data={"token": "wrong"}).status_code == 401
    login = client.post("/login", data={"token": "s3cret"}, follow_redirects=False)
    assert login.status_code == 303 and "httponly" in login.headers["set-cookie"].lower()
    assert client.get("/api/jobs").status_code == 200                  # the cookie now carries it


def test_serve_refuses_an_open_address_without_a_token(monkeypatch, capsys, tmp_path):
    from vidgen.cli import main

    monkeypatch.delenv("VIDGEN_TOKEN", raising=False)
    assert main(["queue", "--db", str(tmp_path / "q.db"), "serve", "--host", "0.0.0.0"]) == 2
    assert "token" in capsys.readouterr().err
    assert main(["queue", "serve", "--db", str(tmp_path / "q.db"), "--host", "0.0.0.0"]) == 2     # --db after serve too
    assert "token" in capsys.readouterr().err


def test_events_stream_job_changes(service, tmp_path):
    client, cfg = service(poll_s=0.05)
    [job_id] = _submit(client, {"config": "render.json"})["ids"]
    with client.stream("GET", "/api/events") as stream:
        Ledger(tmp_path / "q.db").pause(job_id)       # only changes are sent (the page reads the list itself)
        lines = stream.iter_lines()
        seen = []
        for line in lines:
            seen.append(line)
            if line.startswith("data:") and json.loads(line[5:]).get("id") == job_id:
                break
        assert any(line == "event: job" for line in seen)
        assert json.loads(seen[-1][5:])["state"] == "paused"


def test_workflow_submit_and_links_out_of_the_roots(service, tmp_path):
    client, cfg = service()
    wf = {"name": "film", "output_dir": str(tmp_path / "film"),
          "defaults": {"model.path": cfg["model"]["path"], "model.device": "cpu", "size": "64x64", "num_frames": 5,
                       "fps": 8, "sampling.steps": 2},
          "shots": [{"name": "one", "prompt": "a red circle moving right", "seed": 1},
                    {"name": "two", "prompt": "a blue square moving up", "seed": 2}],
          "steps": {"stitch": {"output": "film.mp4"}}}
    ids = _submit(client, {"workflow": wf})["ids"]
    jobs = client.get("/api/jobs", params={"workflow": "film"}).json()["jobs"]
    assert [j["id"] for j in jobs] == ids and [j["kind"] for j in jobs] == ["render", "render", "stitch"]
    assert client.get(f"/api/jobs/{ids[2]}").json()["deps"] == ids[:2]
    # A link inside a root that points outside it is outside: the real path is what counts.
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (tmp_path / "link").symlink_to(outside)
    r = client.post("/api/jobs", json={"config": {**cfg, "output": {"path": str(tmp_path / "link" / "x.mp4")}}})
    assert r.status_code == 422 and "outside the service's roots" in r.text
    assert list(outside.iterdir()) == []


def test_hostile_requests(service, tmp_path):
    client, cfg = service(max_body=4096)
    [job_id] = _submit(client, {"config": "render.json", "overrides": ["seed=3"]})["ids"]
    # A write sent by another site's page (a browser names the origin) is refused, whatever its type.
    r = client.post(f"/api/jobs/{job_id}/cancel", headers={"Origin": "http://evil.example"})
    assert r.status_code == 403
    r = client.post("/api/jobs", content=json.dumps({"config": "render.json"}),
                    headers={"Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain"})
    assert r.status_code == 403 and client.get(f"/api/jobs/{job_id}").json()["state"] == "queued"
    # A chunked body (no length to check first) over the limit: 413, not an error.
    r = client.post("/api/jobs", content=iter([b'{"config": "', b"x" * 5000, b'"}']),
                    headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    # Files a submission names are checked against the roots before any is read.
    outside = tmp_path.parent / f"{tmp_path.name}-words.txt"
    outside.write_text("secret\n")
    for body in ({"config": {**cfg, "guard": {"enabled": True, "blocklists": [str(outside)]}}},
                 {"config": "render.json", "overrides": [f"guard.blocklists=[{outside}]"]},
                 {"workflow": {"name": "w", "output_dir": "film", "defaults": {"config": str(outside)},
                               "shots": [{"prompt": "a red circle"}]}}):
        r = client.post("/api/jobs", json=body)
        assert r.status_code == 422 and "outside the service's roots" in r.text and "secret" not in r.text, r.text
    # Edits: the output was fixed when the job was queued (every attempt writes the same file) and
    # moves only with output.path; a started or finished job cannot be edited (409).
    edited = client.patch(f"/api/jobs/{job_id}", json={"seed": 9}).json()
    assert edited["output"].endswith("clip-3.mp4") and client.get(f"/api/jobs/{job_id}").json()["payload"]["seed"] == 9
    edited = client.patch(f"/api/jobs/{job_id}", json={"overrides": [f"output.path={tmp_path}/out/take-9.mp4"]}).json()
    assert edited["output"] == str(tmp_path / "out" / "take-9.mp4")
    ledger = Ledger(tmp_path / "q.db")
    job = ledger.claim("w", 60)
    ledger.release(job.id, "w", paused=True)                    # paused after it started
    assert client.patch(f"/api/jobs/{job_id}", json={"seed": 4}).status_code == 409
    assert client.patch(f"/api/jobs/{job_id}", json={"priority": 3}).status_code == 200


def test_login_is_rate_limited_and_the_cookie_is_not_the_token(service):
    client, _ = service(token="s3cret")
    for _ in range(5):
        assert client.post("/login", data={"token": "guess"}).status_code == 401
    assert client.post("/login", data={"token": "s3cret"}).status_code == 429
    fresh, _ = service(token="s3cret")
    login = fresh.post("/login", data={"token": "s3cret"}, follow_redirects=False)
    assert login.status_code == 303 and "s3cret" not in login.headers["set-cookie"]
