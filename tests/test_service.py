"""The queue service: every endpoint through Starlette's test client, every bad input, the token."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")

from starlette.testclient import TestClient  # noqa: E402

from vidgen.queue.ledger import Ledger  # noqa: E402
from vidgen.queue.service import create_app  # noqa: E402

LOCAL = "http://127.0.0.1:8765"         # a loopback name: without a token the service answers no other Host


@pytest.fixture
def service(tiny_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = {"model": {"path": str(tiny_model()), "device": "cpu"}, "prompt": "a red circle moving right",
           "size": "64x64", "num_frames": 5, "fps": 8, "sampling": {"steps": 2},
           "output": {"path": str(tmp_path / "out" / "clip-{seed}.mp4")}}
    (tmp_path / "render.json").write_text(json.dumps(cfg))
    db = tmp_path / "q.db"

    def make(**kw):
        return TestClient(create_app(db, roots=[tmp_path, Path(tiny_model()).parent], **kw), base_url=LOCAL), cfg
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


# ------------------------------------------------------------------------------- issue 34: hostile requests

def _short_json_error(r) -> dict:
    """A refusal as the API owes it: 4xx, one short JSON error, no traceback."""
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:500])
    assert r.headers["content-type"].startswith("application/json"), r.text[:200]
    assert "Traceback" not in r.text and len(r.text) < 2000, r.text[:500]
    data = r.json()
    assert isinstance(data["error"], str) and "\n" not in data["error"]
    return data


BIG = "12345678901234567890"            # 20 digits: beyond SQLite's 64-bit integers


@pytest.mark.parametrize("method, url, kw", [
    ("GET", "/api/jobs", {"headers": {"Host": b"caf\xe9\xff:8765"}}),                   # not UTF-8
    ("POST", "/api/queue/pause", {"headers": {"Origin": b"http://\xff\xfe"}}),
    ("POST", "/api/jobs", {"content": b'{"config": "\xff\xfe"}'}),                        # body not UTF-8
    ("GET", f"/api/jobs/{BIG}", {}),
    ("GET", f"/api/jobs/{BIG}/logs", {}),
    ("GET", f"/api/jobs/{BIG}/preview", {}),
    ("POST", f"/api/jobs/{BIG}/cancel", {}),
    ("PATCH", f"/api/jobs/{BIG}", {"json": {"priority": 1}}),
    ("POST", "/api/jobs", {"json": {"config": "render\x00.json"}}),
    ("POST", "/api/jobs", {"json": {"config": "render.json", "overrides": ["image=a\x00.png"]}}),
    ("POST", "/api/jobs", {"content": b"[" * 100_000 + b"]" * 100_000}),                 # past the parser's stack
    ("POST", "/api/jobs", {"content": ('{"config": ' + '{"a": ' * 40 + "1" + "}" * 40 + "}").encode()}),
    ("POST", "/api/jobs", {"content": b'{"config": "render.json", "overrides": ["fps=NaN"], "x": NaN}'}),
    ("PATCH", "/api/jobs/1", {"json": {"priority": 2**70}}),
    ("PATCH", "/api/jobs/1", {"json": {"priority": -2**64}}),
    ("PATCH", "/api/jobs/1", {"json": {"seed": 2**64}}),
    ("PATCH", "/api/jobs/1", {"json": {"overrides": [1]}}),
    ("PATCH", "/api/jobs/1", {"json": {"overrides": "seed=2"}}),
    ("POST", "/api/jobs", {"json": {"config": "render.json", "overrides": [{"seed": 1}]}}),
    ("POST", "/api/jobs", {"content": b'{"config": "\\ud800.json"}'}),                    # a lone surrogate
    ("PATCH", "/api/jobs/1", {"content": b'{"prompt": "a fox \\udc00"}'}),
    ("POST", "/api/jobs", {"content": b'{"config": {"prompt": "x", "\\ud800": 1}}'}),
    ("POST", "/api/jobs", {"headers": {"Content-Length": "9" * 30}, "content": b"{}"}),
])
def test_malformed_requests_are_4xx_not_500(service, method, url, kw):
    client, _ = service()
    _submit(client, {"config": "render.json", "overrides": ["seed=3"]})
    r = client.request(method, url, **kw)
    _short_json_error(r)
    job = client.get("/api/jobs/1").json()
    assert job["payload"]["seed"] == 3 and job["priority"] == 0 and job["state"] == "queued"   # nothing changed
    assert client.get("/api/jobs").json()["paused"] is False and len(client.get("/api/jobs").json()["jobs"]) == 1


def test_a_header_that_is_not_utf8_is_read_as_latin1(service):
    client, _ = service()
    assert client.get("/api/jobs", headers={"X-Note": b"caf\xe9 \xff"}).status_code == 200


@pytest.mark.parametrize("headers", [{"Authorization": "Bearer caf\u00e9".encode("utf-8")},
                                     {"Authorization": b"Bearer \xff\xfe"},
                                     {"Cookie": "vidgen_session=caf\u00e9".encode("utf-8")},
                                     {"Cookie": b"vidgen_session=\xff; other=\xfe"}])
def test_a_non_ascii_token_or_cookie_is_401(service, headers):
    client, _ = service(token="s3cret-token")
    _short_json_error(client.get("/api/jobs", headers=headers))


def test_an_unexpected_error_is_a_one_line_json_500(service, monkeypatch, caplog):
    client, _ = service()

    def boom(*a, **k):
        raise RuntimeError("secret detail of a bug")
    monkeypatch.setattr(client.app.state.service.ledger, "jobs", boom)
    r = client.get("/api/jobs")
    assert r.status_code == 500
    assert r.json() == {"error": "internal error in the queue service; its log has the details"}
    assert "secret detail" not in r.text and "Traceback" not in r.text
    assert "secret detail of a bug" in caplog.text                      # the log has it


def test_a_404_does_not_name_the_ledger(service, tmp_path):
    client, _ = service()
    for r in (client.get("/api/jobs/999"), client.post("/api/jobs/999/cancel"), client.get("/api/jobs/999/logs"),
              client.patch("/api/jobs/999", json={"priority": 1})):
        assert r.status_code == 404 and r.json()["error"] == "no job #999", r.text
        assert "q.db" not in r.text and str(tmp_path) not in r.text
    r = client.post("/api/jobs", json={"config": "render.json", "overrides": ["seed=1"]})
    assert r.status_code == 201


def test_without_a_token_only_loopback_names_are_served(service):
    """DNS rebinding: a page on evil.example, its name pointed at 127.0.0.1, sends Host: evil.example."""
    client, _ = service()
    for host in ("evil.example", "evil.example:8765", "127.0.0.1.evil.example", "localhost.evil.example:8765",
                 "192.168.1.9:8765", "0.0.0.0:8765", ""):
        for method, url in (("GET", "/api/jobs"), ("GET", "/"), ("GET", "/api/events"), ("POST", "/api/queue/pause")):
            r = client.request(method, url, headers={"Host": host, "Origin": f"http://{host}"})
            assert r.status_code == 421 and "loopback" in _short_json_error(r)["error"], (host, url, r.text)
    assert client.get("/api/jobs").json()["paused"] is False
    for host in ("127.0.0.1", "localhost:8765", "LOCALHOST", "[::1]:8765", "localhost."):
        assert client.get("/api/jobs", headers={"Host": host}).status_code == 200, host
    # Same host, another origin: a write is still refused as cross-site.
    assert client.post("/api/queue/pause", headers={"Host": "localhost:8765",
                                                    "Origin": "http://localhost:9999"}).status_code == 403
    # With a token, other names are served (the token guards it).
    tokened, _ = service(token="s3cret-token")
    assert tokened.get("/api/jobs", headers={"Host": "queue.studio.example",
                                             "Authorization": "Bearer s3cret-token"}).status_code == 200


def test_every_wrong_token_counts_against_the_peer_address(service, tmp_path):
    client, _ = service(token="s3cret-token")
    good = {"Authorization": "Bearer s3cret-token"}
    for _ in range(20):                                 # no credential at all: not a guess
        assert client.get("/api/jobs").status_code == 401
    assert client.get("/api/jobs", headers=good).status_code == 200
    for i in range(5):                                  # Bearer guesses, each from a "new" forwarded address
        r = client.get("/api/jobs", headers={"Authorization": f"Bearer guess{i}", "X-Forwarded-For": f"10.9.9.{i}"})
        assert r.status_code == 401
    for r in (client.get("/api/jobs", headers=good), client.get("/api/jobs", headers={"Authorization": "Bearer x"}),
              client.post("/login", data={"token": "s3cret-token"}), client.get("/", follow_redirects=False)):
        assert r.status_code == 429, r.text              # the right token too, until the minute has passed
    other = TestClient(client.app, base_url=LOCAL, client=("10.0.0.2", 4000))
    assert other.get("/api/jobs", headers=good).status_code == 200      # another peer is not locked out
    for _ in range(5):                                  # wrong cookies count as well
        other.get("/", headers={"Cookie": "vidgen_session=forged"}, follow_redirects=False)
    assert other.get("/api/jobs", headers=good).status_code == 429
    svc = client.app.state.service
    for i in range(10_000):                             # the table of peers stays bounded
        svc.failures.failed(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}")
    assert len(svc.failures) <= 4096


def test_serve_refuses_a_guessable_token_for_an_open_address(monkeypatch, capsys, tmp_path):
    import uvicorn

    from vidgen.cli import main

    ran = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: ran.update(kw))
    monkeypatch.delenv("VIDGEN_TOKEN", raising=False)
    db = str(tmp_path / "q.db")
    for token in ("x", "a" * 40, "abcabcabcabcabcabcabcabcabcabcabc", "s3cret"):
        assert main(["queue", "--db", db, "serve", "--host", "0.0.0.0", "--token", token]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "vidgen: error: --token: a token for --host 0.0.0.0 needs at least 32" in err
        assert "secrets.token_urlsafe(32)" in err
    monkeypatch.setenv("VIDGEN_TOKEN", "x")
    assert main(["queue", "--db", db, "serve", "--host", "0.0.0.0"]) == 2 and "at least 32" in capsys.readouterr().err
    assert main(["queue", "--db", db, "serve", "--token", "caf\u00e9-token"]) == 2
    assert "printable ASCII" in capsys.readouterr().err
    assert not ran
    import secrets

    assert main(["queue", "--db", db, "serve", "--host", "0.0.0.0", "--token", secrets.token_urlsafe(32)]) == 0
    assert ran["proxy_headers"] is False                # the peer is the socket's address, never X-Forwarded-For
    monkeypatch.delenv("VIDGEN_TOKEN")
    assert main(["queue", "--db", db, "serve", "--token", "x"]) == 0     # on loopback a short token is the user's call


def test_a_stream_client_that_never_reads_is_bounded():
    from vidgen.queue.service import EVENT_BACKLOG, _Subscriber

    sub = _Subscriber()
    for i in range(50 * EVENT_BACKLOG):
        sub.offer(("job", {"id": i, "state": "running"}))
    assert sub.queue.qsize() <= EVENT_BACKLOG
    events = [sub.queue.get_nowait() for _ in range(sub.queue.qsize())]
    assert ("resync", {"dropped": sub.dropped}) in events and sub.dropped > 0
    assert events[-1] == ("job", {"id": 50 * EVENT_BACKLOG - 1, "state": "running"})


def test_the_stream_outlives_a_failed_ledger_read(service, tmp_path):
    client, _ = service(poll_s=0.05)
    svc = client.app.state.service
    [job_id] = _submit(client, {"config": "render.json"})["ids"]
    real, calls = svc.state, []

    def flaky():
        calls.append(1)
        if len(calls) in (2, 3):
            raise OSError("disk I/O error")
        return real()
    svc.state = flaky
    deadline = time.monotonic() + 60            # a dead stream still sends keep-alives: the loop ends
    with client.stream("GET", "/api/events") as stream:
        seen, kind = [], None
        for line in stream.iter_lines():
            assert time.monotonic() < deadline, f"no job event after a failed read; seen {seen}"
            if line.startswith("event:"):
                kind = line[7:]
            elif line.startswith("data:"):
                seen.append((kind, json.loads(line[5:])))
                if kind == "status" and seen[-1][1]["live"]:
                    Ledger(tmp_path / "q.db").pause(job_id)
                if kind == "job":
                    break
    assert seen[0] == ("status", {"live": False, "error": "the queue ledger cannot be read now"})
    assert ("status", {"live": True}) in seen and seen[-1][1]["state"] == "paused", seen


@pytest.fixture
def fifo(tmp_path):
    """A FIFO inside the roots, and a check that nothing opened it: a writer that can open it
    non-blocking finds a reader (the service) waiting, records that, and lets the reader go."""
    import errno
    import os
    import threading

    path = tmp_path / "pipe.yaml"
    os.mkfifo(path)
    opened, done = [], threading.Event()

    def watch():
        while not done.wait(0.02):
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as e:
                assert e.errno == errno.ENXIO           # no reader: as it should be
                continue
            opened.append(1)
            os.close(fd)                                # EOF for the reader, which then goes on
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    yield path, opened
    done.set()
    thread.join()


def test_a_fifo_named_in_a_submission_is_never_opened(service, tmp_path, fifo):
    client, cfg = service()
    path, opened = fifo
    model = tmp_path / "model"
    model.mkdir()
    (model / "model_index.json").symlink_to(path)
    bodies = [{"config": str(path)}, {"config": "pipe.yaml"}, {"workflow": "pipe.yaml"},
              {"config": {**cfg, "image": str(path)}}, {"config": "render.json", "overrides": [f"image={path}"]},
              {"config": {**cfg, "config": str(path)}}, {"config": {**cfg, "loras": [{"path": str(path)}]}},
              {"config": {**cfg, "guard": {"enabled": True, "blocklists": [str(path)]}}},
              {"config": {**cfg, "model": {"path": str(model), "device": "cpu"}}},
              {"workflow": {"name": "w", "output_dir": "film", "defaults": {"model.path": str(model)},
                            "shots": [{"prompt": "a red circle"}]}},
              {"workflow": {"name": "w", "output_dir": "film", "defaults": {"model.path": cfg["model"]["path"]},
                            "shots": [{"prompt": "a red circle", "image": str(path)}]}}]
    for body in bodies:
        r = client.post("/api/jobs", json=body)
        assert r.status_code == 422 and "is a FIFO; name a regular file" in r.text, (body, r.text)
    assert client.patch("/api/jobs/1", json={"overrides": [f"image={path}"]}).status_code == 404
    [job_id] = _submit(client, {"config": "render.json"})["ids"]
    r = client.patch(f"/api/jobs/{job_id}", json={"overrides": [f"last_image={path}"]})
    assert r.status_code == 422 and "FIFO" in r.text
    assert not opened, "the service opened the FIFO"


def test_missing_and_outside_files_get_one_answer(service, tmp_path):
    """The answer for a file outside the roots does not depend on whether it exists."""
    client, cfg = service()
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "there.png").write_bytes(b"\x89PNG not really")
    (outside / "there").mkdir()
    (outside / "there" / "model_index.json").write_text("{}")
    answers = {}
    for name in ("there", "absent"):
        for key, body in (("image", {"config": {**cfg, "image": str(outside / f"{name}.png")}}),
                          ("override", {"config": "render.json", "overrides": [f"last_image={outside}/{name}.png"]}),
                          ("model", {"config": {**cfg, "model": {"path": str(outside / name), "device": "cpu"}}}),
                          ("lora", {"config": {**cfg, "loras": [{"path": str(outside / f"{name}.png")}]}}),
                          ("colour", {"config": {**cfg, "output": {**cfg["output"],
                                                                   "colour_reference": str(outside / f"{name}.png")}}}),
                          ("shot", {"workflow": {"name": "w", "output_dir": "film",
                                                 "defaults": {"model.path": cfg["model"]["path"]},
                                                 "shots": [{"prompt": "a red circle",
                                                            "image": str(outside / f"{name}.png")}]}})):
            r = client.post("/api/jobs", json=body)
            assert r.status_code == 422 and "outside the service's roots" in r.text, (key, r.text)
            answers.setdefault(key, []).append(r.text.replace(name, "NAME"))
    for key, (there, absent) in answers.items():
        assert there == absent, key


def test_a_seed_stays_fixed(service):
    client, _ = service()
    [job_id] = _submit(client, {"config": "render.json", "overrides": ["seed=3"]})["ids"]
    for body in ({"seed": None}, {"overrides": ["seed=null"]}, {"seed": None, "prompt": "a blue square"}):
        r = client.patch(f"/api/jobs/{job_id}", json=body)
        assert r.status_code == 422 and "seed" in r.text, r.text
    assert client.get(f"/api/jobs/{job_id}").json()["payload"]["seed"] == 3


def test_jobs_whose_derived_files_collide_are_refused(service, tmp_path):
    client, cfg = service()
    out = tmp_path / "out"
    _submit(client, {"config": {**cfg, "seed": 1, "output": {"path": str(out / "x.mp4")}}})
    for other in ("x.mkv", "x"):
        r = client.post("/api/jobs", json={"config": {**cfg, "seed": 1, "output": {"path": str(out / other)}}})
        assert r.status_code == 422 and f"both write {out}/x.latents.safetensors (the latents)" in r.text, r.text
    [second] = _submit(client, {"config": {**cfg, "seed": 1, "output": {"path": str(out / "y.mp4")}}})["ids"]
    r = client.patch(f"/api/jobs/{second}", json={"overrides": [f"output.path={out}/x.webm"]})
    assert r.status_code == 409 and "both write" in r.text and "q.db" not in r.text, r.text
    assert client.get(f"/api/jobs/{second}").json()["output"] == str(out / "y.mp4")


def test_an_escaped_resolver_never_reaches_the_environment(service, tmp_path, monkeypatch):
    """`\\${oc.env:VAR}` in a submission is refused or kept as written; the variable's value never
    lands in the job, the ledger or an answer of the API."""
    from vidgen.presets import load_config

    secret = "sk-live-0123456789"
    monkeypatch.setenv("VIDGEN_TEST_SECRET", secret)
    client, cfg = service()
    escaped = r"\${oc.env:VIDGEN_TEST_SECRET}"
    answers = [client.post("/api/jobs", json=body) for body in (
        {"config": {**cfg, "seed": 1, "prompt": f"a fox {escaped}"}},
        {"config": "render.json", "overrides": [f"prompt=a fox {escaped}", "seed=2"]},
        {"config": {**cfg, "seed": 3, "negative_prompt": f"{escaped}"}},
        {"workflow": {"name": "w", "output_dir": "film", "defaults": {"model.path": cfg["model"]["path"]},
                      "shots": [{"prompt": f"a fox {escaped}", "seed": 4}]}})]
    [job_id] = _submit(client, {"config": "render.json", "overrides": ["seed=5"]})["ids"]
    answers.append(client.patch(f"/api/jobs/{job_id}", json={"prompt": f"a fox {escaped}"}))
    answers.append(client.patch(f"/api/jobs/{job_id}", json={"overrides": [f"prompt=a fox {escaped}"]}))
    for r in answers:
        assert r.status_code < 500 and secret not in r.text, r.text
    for job in Ledger(tmp_path / "q.db").jobs():
        assert secret not in json.dumps(job.to_dict())
        assert secret not in client.get(f"/api/jobs/{job.id}").text
        if job.kind == "render":                    # a worker loads the payload again: no resolution then either
            try:
                assert secret not in json.dumps(load_config(job.payload).prompt)
            except Exception as e:                  # noqa: BLE001 - refused is fine, leaking is not
                assert secret not in str(e)
    assert secret not in (tmp_path / "q.db").read_bytes().decode("latin-1")


@pytest.mark.skipif(not shutil.which("node"), reason="needs Node.js to load the page's jobs.js")
def test_the_page_shows_a_stage_only_for_a_job_at_work():
    """A finished stitch does not show the last stage a worker reported ("decode 2/17")."""
    script = """
    const {row} = require(process.argv[1]);
    const out = {};
    for (const state of ["succeeded", "failed", "canceled", "blocked-by-guard", "queued", "waiting-on-deps",
                         "running", "paused"])
      out[state] = row({id: 3, kind: "stitch", name: "film", state, attempts: 1, max_attempts: 3, priority: 0,
                        eta_s: 4, progress: {stage: "decode", step: 2, total: 17}}, null);
    console.log(JSON.stringify(out));
    """
    jobs_js = Path(__file__).resolve().parents[1] / "vidgen" / "queue" / "static" / "jobs.js"
    rows = json.loads(subprocess.run(["node", "-e", script, str(jobs_js)], capture_output=True, text=True,
                                     check=True, timeout=60).stdout)
    for state, html in rows.items():
        at_work = state in ("running", "paused")
        assert ("decode 2/17" in html) == at_work and ("<td>4s</td>" in html) == at_work, (state, html)
    assert 'style="width:100%"' in rows["succeeded"] and 'style="width:0%"' in rows["failed"]


def test_an_unusable_ledger_is_refused_without_its_path(service, tmp_path):
    client, _ = service()
    svc = client.app.state.service
    svc.ledger.close()
    (tmp_path / "q.db").write_bytes(b"not a database" * 100)         # replaced under the service
    for r in (client.get("/api/jobs"), client.get("/api/jobs/1"), client.post("/api/jobs/1/cancel")):
        data = _short_json_error(r)
        assert "q.db" not in r.text and str(tmp_path) not in r.text, r.text
        assert data["error"].startswith("cannot use the queue ledger: "), data
