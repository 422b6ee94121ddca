"""The queue as a service: a JSON API under /api and one page, over the same ledger the workers use.

    vidgen queue serve [--host 127.0.0.1] [--port 8765] [--db PATH] [--root DIR ...] [--token T]

The service never renders: it reads and writes the ledger, and workers run as they always do. A
submit goes through the queue API (vidgen.queue.api), so it is checked exactly as `vidgen queue
submit` checks it: every problem at once (422 with the list), a blocked prompt refused (403 with
the rule). Safe by default:

- it binds to 127.0.0.1; another address needs a token (--token or VIDGEN_TOKEN), and then every
  request must carry it (`Authorization: Bearer T`, or the cookie the login form sets);
- no CORS headers, request bodies of at most `max_body` bytes (413);
- every file a submitted config reads or writes (config, images, model files, LoRAs, outputs) must
  lie inside the configured roots, symbolic links resolved (422 otherwise), and the API serves no
  file outside them;
- every write action is logged in the job's log with the time and the client's address.

Built on Starlette (the `serve` extra): a small ASGI toolkit, well kept, with a test client.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from ..errors import ConfigError, GuardrailBlocked, InputError, VidgenError
from ..paths import preview_path
from . import api
from .jobs import Job, JobState
from .ledger import Ledger
from .workflow import _is_repo_id

log = logging.getLogger("vidgen")

MAX_BODY = 1 << 20
STATIC = Path(__file__).parent / "static"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
ACTIONS = ("cancel", "pause", "resume", "retry")
EDITABLE = ("prompt", "seed", "overrides")
COOKIE = "vidgen_session"
PATH_KEYS = ("config", "blocklists", "engine_cache")     # keys whose values name files read when a job is planned
LOGIN_TRIES = 5                                          # failed logins per client per minute before 429


def session_value(token: str) -> str:
    """What the login cookie holds: derived from the token, not the token itself."""
    return hmac.new(token.encode(), b"vidgen queue session", hashlib.sha256).hexdigest()


def _preview_version(job: Job) -> int | None:
    """The mtime (ms) of a started, unfinished render's preview image, if it has one (the page's cache key)."""
    if job.output is None or job.state not in (JobState.RUNNING, JobState.PAUSED, JobState.QUEUED) or not job.started:
        return None
    try:
        return Path(preview_path(Path(job.output))).stat().st_mtime_ns // 1_000_000
    except OSError:
        return None


def job_json(job: Job) -> dict:
    p = job.progress or {}
    return {"id": job.id, "name": job.name, "kind": job.kind, "state": job.state.value, "priority": job.priority,
            "group": job.group, "progress": {k: p.get(k) for k in ("stage", "step", "total")}, "eta_s": p.get("eta_s"),
            "attempts": job.attempts, "max_attempts": job.max_attempts, "error": job.error, "output": job.output,
            "deps": job.deps, "created": job.created, "started": job.started, "finished": job.finished,
            "lease_expires": job.lease_expires, "preview": _preview_version(job)}


class Service:
    """The app's state: the ledger, the roots, the token, and the event poller's subscribers."""

    def __init__(self, db: str | os.PathLike, roots: list[str | os.PathLike], token: str | None, max_body: int,
                 poll_s: float):
        self.ledger = Ledger(db)
        self.roots = [Path(r).expanduser().resolve() for r in roots] or [Path.cwd().resolve()]
        self.token, self.max_body, self.poll_s = token, max_body, poll_s
        self.subscribers: set[asyncio.Queue] = set()
        self.failed_logins: dict[str, list[float]] = {}
        self.poller: asyncio.Task | None = None

    # --------------------------------------------------------------------------------- paths

    def inside(self, path: str | os.PathLike) -> bool:
        p = Path(path).expanduser()
        p = (p if p.is_absolute() else Path.cwd() / p).resolve()
        return any(p == r or p.is_relative_to(r) for r in self.roots)

    def confine(self, specs) -> list[str]:
        """Every file the planned jobs read or write that lies outside the roots."""
        out = []
        for spec in specs:
            paths = []
            if spec.kind == "render":
                cfg = spec.payload
                model, output = cfg.get("model", {}), cfg.get("output", {})
                paths += [model.get(k) for k in ("transformer", "transformer_2", "text_encoder", "vae", "tokenizer")]
                if model.get("path") and not _is_repo_id(model["path"]):     # a repo id names the model cache
                    paths.append(model["path"])
                paths += [cfg.get("image"), cfg.get("last_image"), output.get("path"), output.get("colour_reference")]
                paths += [lora.get("path") for lora in cfg.get("loras") or []]
                guard = cfg.get("guard") or {}
                paths += [b for b in guard.get("blocklists") or [] if b != "default"] + [guard.get("engine_cache")]
            else:
                paths += [spec.payload.get("output"), *spec.payload.get("inputs", [])]
            out += [f"{spec.name or spec.kind}: {p!r} is outside the service's roots ({', '.join(map(str, self.roots))})"
                    for p in paths if p and not self.inside(p)]
        return out

    # --------------------------------------------------------------------------------- events

    def snapshot(self) -> dict[int, dict]:
        return {j.id: job_json(j) for j in self.ledger.jobs()}

    def state(self) -> tuple[dict[int, dict], bool]:
        return self.snapshot(), self.ledger.is_paused()

    async def poll(self, last: dict[int, dict], paused: bool) -> None:
        """One poller for every /api/events client: the ledger read every poll_s, changes since
        (`last`, `paused`) sent to all. Only changes: a client reads the list itself (GET /api/jobs)
        once its stream is open, and the baseline was taken before that."""
        while self.subscribers:
            await asyncio.sleep(self.poll_s)
            now, state = await asyncio.to_thread(self.state)
            events = [("job", j) for i, j in now.items() if last.get(i) != j]
            events += [("removed", {"id": i}) for i in last if i not in now]
            if state != paused:
                events.append(("queue", {"paused": state}))
            last, paused = now, state
            for q in list(self.subscribers):
                for e in events:
                    q.put_nowait(e)
        self.poller = None


def _log(svc: Service, job_id: int, action: str, request) -> None:
    client = request.client.host if request.client else "?"
    svc.ledger.log(job_id, f"{time.strftime('%Y-%m-%d %H:%M:%S')} {action} by {client} (HTTP)")


def create_app(db: str | os.PathLike, *, roots: list[str | os.PathLike] = (), token: str | None = None,
               max_body: int = MAX_BODY, poll_s: float = 0.5):
    """The ASGI app of the service (Starlette)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import (FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response,
                                     StreamingResponse)
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    svc = Service(db, list(roots), token, max_body, poll_s)

    def error(status: int, message: str, **extra) -> JSONResponse:
        return JSONResponse({"error": message, **extra}, status_code=status)

    def ledger_error(e: InputError) -> JSONResponse:
        return error(404 if str(e).startswith("no job #") else 409, str(e))

    async def body(request: Request) -> Any:
        raw = await request.body()
        try:
            return json.loads(raw or b"{}")
        except ValueError:
            raise ConfigError("the request body is not JSON") from None

    def jobs(request: Request):
        state, group = request.query_params.get("state"), request.query_params.get("workflow")
        try:
            found = svc.ledger.jobs(state, group)
        except InputError as e:
            return error(422, str(e))
        return JSONResponse({"jobs": [job_json(j) for j in found], "paused": svc.ledger.is_paused()})

    def job(request: Request):
        try:
            j = svc.ledger.get(int(request.path_params["id"]))
        except InputError as e:
            return ledger_error(e)
        return JSONResponse({**job_json(j), "payload": j.payload, "attempt_history": svc.ledger.history(j.id)})

    def logs(request: Request):
        try:
            svc.ledger.get(int(request.path_params["id"]))
        except InputError as e:
            return ledger_error(e)
        return JSONResponse({"logs": [{"attempt": a, "time": t, "text": x}
                                      for a, t, x in svc.ledger.logs(int(request.path_params["id"]))]})

    async def submit(request: Request):
        try:
            data = await body(request)
            if not isinstance(data, dict) or len({"config", "workflow"} & set(data)) != 1:
                raise ConfigError('give {"config": PATH_OR_MAPPING, "overrides": [...]} or {"workflow": PATH_OR_MAPPING}')
            overrides = data.get("overrides") or []
            if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
                raise ConfigError("overrides: give a list of KEY=VALUE strings")
            source = data.get("config", data.get("workflow"))
            specs = await asyncio.to_thread(_plan, svc, source, "workflow" in data, overrides)
            if bad := svc.confine(specs):
                raise ConfigError(bad)
            ids = await asyncio.to_thread(api.submit_specs, svc.ledger, specs)
        except GuardrailBlocked as e:
            return error(403, str(e), rule=str(e).split("rule '")[-1].split("'")[0] if "rule '" in str(e) else None)
        except ConfigError as e:
            return error(422, "invalid submission", problems=e.problems)
        except VidgenError as e:
            return error(422, "invalid submission", problems=[str(e)])
        for i in ids:
            _log(svc, i, "submitted", request)
        return JSONResponse({"ids": ids}, status_code=201)

    def act(request: Request):
        job_id, action = int(request.path_params["id"]), request.path_params["action"]
        if action not in ACTIONS:
            return error(404, f"no action {action!r}; use one of {', '.join(ACTIONS)}")
        try:
            result = getattr(api, action)(svc.ledger, job_id)
        except InputError as e:
            return ledger_error(e)
        _log(svc, job_id, action, request)
        return JSONResponse({"id": job_id, "result": result.value if isinstance(result, JobState) else result,
                             "state": svc.ledger.get(job_id).state.value})

    async def edit(request: Request):
        job_id = int(request.path_params["id"])
        try:
            data = await body(request)
            if not isinstance(data, dict) or not data or set(data) - {"priority", *EDITABLE}:
                raise ConfigError(f"give priority, or {', '.join(EDITABLE)} of a job that has not started")
            current = svc.ledger.get(job_id)
            payload = output = None
            if set(data) & set(EDITABLE):
                ran = current.attempts or svc.ledger.history(job_id)      # a paused job may have run already
                if ran or current.state.value not in ("queued", "waiting-on-deps", "paused"):
                    return error(409, f"job #{job_id} is {current.state.value} and has started "
                                      "; only a job that has not started can be edited")
                if current.kind != "render":
                    raise ConfigError(f"job #{job_id} is a {current.kind} job; only render jobs have a prompt and seed")
                payload, output = await asyncio.to_thread(_edited, svc, current, data)
            priority = data.get("priority")
            if priority is not None and (not isinstance(priority, int) or isinstance(priority, bool)):
                raise ConfigError("priority: give an integer (higher runs first)")
            svc.ledger.update(job_id, priority=priority, payload=payload, output=output)
        except InputError as e:
            return ledger_error(e)
        except ConfigError as e:
            return error(422, "invalid edit", problems=e.problems)
        except VidgenError as e:
            return error(422, "invalid edit", problems=[str(e)])
        _log(svc, job_id, f"edited ({', '.join(sorted(data))})", request)
        return JSONResponse(job_json(svc.ledger.get(job_id)))

    def queue_action(request: Request):
        action = request.path_params["action"]
        if action not in ("pause", "resume"):
            return error(404, f"no queue action {action!r}; use pause or resume")
        getattr(svc.ledger, action)()
        log.info("%s queue %s by %s (HTTP)", time.strftime("%Y-%m-%d %H:%M:%S"), action,
                 request.client.host if request.client else "?")
        return JSONResponse({"paused": svc.ledger.is_paused()})

    async def events(request: Request):
        q: asyncio.Queue = asyncio.Queue()
        svc.subscribers.add(q)
        if svc.poller is None:      # its baseline before this stream opens: nothing after it is missed
            svc.poller = asyncio.create_task(svc.poll(*await asyncio.to_thread(svc.state)))

        async def stream():
            try:
                yield ": vidgen events\n\n"
                while not await request.is_disconnected():
                    try:
                        kind, data = await asyncio.wait_for(q.get(), timeout=15)
                        yield f"event: {kind}\ndata: {json.dumps(data)}\n\n"
                    except asyncio.TimeoutError:
                        yield ": keep-alive\n\n"
            finally:
                svc.subscribers.discard(q)
        return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    def preview(request: Request):
        try:
            j = svc.ledger.get(int(request.path_params["id"]))
        except InputError as e:
            return ledger_error(e)
        candidates = []
        if j.output:        # a finished job's output; else the latest preview of its render, if any
            candidates = ([Path(j.output)] if j.state == JobState.SUCCEEDED else [preview_path(Path(j.output))]
                          if j.state in (JobState.RUNNING, JobState.PAUSED, JobState.QUEUED) else [])
        for path in candidates:
            if path.is_file() and svc.inside(path):
                return FileResponse(path)
        return error(404, f"job #{j.id} has no preview yet")

    def page(request: Request):
        return HTMLResponse((STATIC / "index.html").read_text())

    def login_form(request: Request):
        return HTMLResponse((STATIC / "login.html").read_text())

    async def login(request: Request):
        from urllib.parse import parse_qs      # the form is urlencoded: no multipart parser needed

        client, now = request.client.host if request.client else "?", time.monotonic()
        recent = [t for t in svc.failed_logins.get(client, []) if now - t < 60]
        if len(recent) >= LOGIN_TRIES:
            return HTMLResponse("<p>Too many wrong tokens; wait a minute.</p>", status_code=429)
        given = parse_qs((await request.body()).decode("utf-8", "replace")).get("token", [""])[0]
        if svc.token and hmac.compare_digest(given, svc.token):
            svc.failed_logins.pop(client, None)
            response = RedirectResponse("/", status_code=303)
            response.set_cookie(COOKIE, session_value(svc.token), httponly=True, samesite="strict",
                                secure=request.url.scheme == "https")
            return response
        svc.failed_logins[client] = [*recent, now]
        return HTMLResponse((STATIC / "login.html").read_text().replace("<!--error-->", "<p>Wrong token.</p>"),
                            status_code=401)

    routes = [Route("/", page), Route("/login", login_form, methods=["GET"]), Route("/login", login, methods=["POST"]),
              Route("/api/jobs", jobs, methods=["GET"]), Route("/api/jobs", submit, methods=["POST"]),
              Route("/api/jobs/{id:int}", job, methods=["GET"]), Route("/api/jobs/{id:int}", edit, methods=["PATCH"]),
              Route("/api/jobs/{id:int}/logs", logs), Route("/api/jobs/{id:int}/preview", preview),
              Route("/api/jobs/{id:int}/{action}", act, methods=["POST"]),
              Route("/api/queue/{action}", queue_action, methods=["POST"]), Route("/api/events", events),
              Mount("/static", StaticFiles(directory=STATIC), name="static")]
    app = Starlette(routes=routes)
    app.state.service = svc
    return _Guard(app, svc, Response)


def _named_files(node: Any, overrides: list[str]) -> list[str]:
    """Every value, anywhere in a submitted config or workflow (and its overrides), under a key that
    names a file read while the job is planned (a preset `config`, guard blocklists, the engine cache)."""
    found: list[str] = []

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                if str(k).rsplit(".", 1)[-1] in PATH_KEYS:
                    found.extend(v if isinstance(v, list) else [v])
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    walk(node)
    for o in overrides:
        key, _, value = o.partition("=")
        if key.rsplit(".", 1)[-1] in PATH_KEYS:
            found.extend(v.strip(" '\"") for v in value.strip("[]").split(","))
    return [f for f in found if isinstance(f, str) and f and f != "default"]


def _plan(svc: Service, source: Any, workflow: bool, overrides: list[str]):
    """Plan a config or workflow given as a path (inside the roots) or as a mapping. Nothing outside
    the roots is read: the files a submission names are checked before any is opened."""
    if isinstance(source, str) and not svc.inside(source):
        raise ConfigError(f"{source!r} is outside the service's roots ({', '.join(map(str, svc.roots))})")
    if isinstance(source, str):
        import yaml

        try:
            raw = yaml.safe_load(Path(source).read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            raw = None          # planning reports what is wrong with the file
    else:
        raw = source
    if bad := [f for f in _named_files(raw, overrides) if not svc.inside(f)]:
        raise ConfigError([f"{f!r} is outside the service's roots ({', '.join(map(str, svc.roots))})" for f in bad])
    if isinstance(source, str):
        return api.plan(source, overrides)
    if not isinstance(source, dict):
        raise ConfigError("config / workflow: give a file path or a mapping")
    if not workflow:
        from .workflow import plan_single

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "config.json"
            path.write_text(json.dumps(source))
            return plan_single(path, overrides)
    from .workflow import load_workflow, plan_jobs

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "workflow.json"
        path.write_text(json.dumps(source))
        return plan_jobs(load_workflow(path, overrides))


def _edited(svc: Service, job: Job, data: dict) -> dict:
    """A render job's payload with a new prompt, seed or overrides, re-validated as a submit would be."""
    from ..config import to_dict
    from ..io import output_path
    from ..presets import load_config
    from .executor import check_specs
    from .jobs import JobSpec

    extra = {k: data[k] for k in ("prompt", "seed") if k in data}
    overrides = data.get("overrides") or []
    if not isinstance(overrides, list):
        raise ConfigError("overrides: give a list of KEY=VALUE strings")
    if bad := [f for f in _named_files({}, overrides) if not svc.inside(f)]:
        raise ConfigError([f"{f!r} is outside the service's roots" for f in bad])
    cfg = load_config({**job.payload, **extra}, overrides)
    output = str(output_path(cfg.output.path, cfg.seed, cfg.prompt))     # a new seed or prompt may name a new file
    spec = JobSpec(kind="render", payload=to_dict(cfg), name=job.name, output=output)
    if bad := svc.confine([spec]):
        raise ConfigError(bad)
    if output != job.output and any(j.output == output and j.state.value not in ("canceled", "failed")
                                    for j in svc.ledger.jobs() if j.id != job.id):
        raise ConfigError(f"output: {output} is another job's output; give another seed or output.path")
    check_specs([spec])
    return spec.payload, output


class _Guard:
    """ASGI wrapper: the token (when set) and the body size limit, before the app sees a request."""

    def __init__(self, app, svc: Service, response_cls):
        self.app, self.svc, self.Response = app, svc, response_cls
        self.state = app.state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
        path = scope.get("path", "")
        if self.svc.token and not path.startswith(("/login", "/static/")) and not self._authorised(headers):
            if path.startswith("/api/"):
                body = json.dumps({"error": "a token is needed: Authorization: Bearer TOKEN"}).encode()
                return await self.Response(body, status_code=401, media_type="application/json")(scope, receive, send)
            return await self.Response(status_code=303, headers={"Location": "/login"})(scope, receive, send)
        if scope.get("method", "GET") not in ("GET", "HEAD") and self._cross_site(headers):
            body = json.dumps({"error": "a request from another site's page is refused"}).encode()
            return await self.Response(body, status_code=403, media_type="application/json")(scope, receive, send)
        too_big = json.dumps({"error": f"the request body is larger than {self.svc.max_body} bytes"}).encode()
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.svc.max_body):
            return await self.Response(too_big, status_code=413, media_type="application/json")(scope, receive, send)
        if scope.get("method", "GET") in ("GET", "HEAD"):
            return await self.app(scope, receive, send)
        # The whole body, counted as it arrives (a chunked one has no length to check first), then replayed.
        chunks, seen, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return
            chunks.append(message.get("body", b""))
            seen, more = seen + len(chunks[-1]), message.get("more_body", False)
            if seen > self.svc.max_body:
                return await self.Response(too_big, status_code=413, media_type="application/json")(scope, receive, send)
        replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def buffered():
            return replay.pop() if replay else await receive()
        return await self.app(scope, buffered, send)

    @staticmethod
    def _cross_site(headers: dict) -> bool:
        """A write sent by a page of another origin (a browser names it in Origin / Sec-Fetch-Site)."""
        if headers.get("sec-fetch-site") in ("cross-site", "same-site"):
            return True
        origin = headers.get("origin")
        return origin is not None and origin.split("://", 1)[-1] != headers.get("host", "")

    def _authorised(self, headers: dict) -> bool:
        token = self.svc.token
        auth = headers.get("authorization", "")
        if auth.startswith("Bearer ") and hmac.compare_digest(auth[7:].strip(), token):
            return True
        for part in headers.get("cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE and hmac.compare_digest(value, session_value(token)):
                return True
        return False


def serve(db: str | os.PathLike, *, host: str = "127.0.0.1", port: int = 8765, roots=(), token: str | None = None) -> None:
    """Run the service with uvicorn (blocking). Another address than loopback needs a token."""
    token = token or os.environ.get("VIDGEN_TOKEN") or None
    if host not in LOOPBACK and not token:
        raise ConfigError(f"--host {host}: the service binds to another address than this machine's only with a token "
                          "(--token or VIDGEN_TOKEN); every request must then carry it")
    try:
        import uvicorn
    except ImportError:
        raise ConfigError("the service needs its extra: pip install 'vidgen[serve]'") from None
    app = create_app(db, roots=list(roots), token=token)
    import gc

    # The modules loaded by now (torch among them) are hundreds of thousands of long-lived objects: kept
    # out of the collector's full passes, which otherwise stall a request now and then (~0.25 s).
    gc.freeze()
    uvicorn.run(app, host=host, port=port, log_level="warning")
