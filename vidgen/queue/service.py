"""The queue as a service: a JSON API under /api and one page, over the same ledger the workers use.

    vidgen queue serve [--host 127.0.0.1] [--port 8765] [--db PATH] [--root DIR ...] [--token T]

The service never renders: it reads and writes the ledger, and workers run as they always do. A
submit goes through the queue API (vidgen.queue.api), so it is checked exactly as `vidgen queue
submit` checks it: every problem at once (422 with the list), a blocked prompt refused (403 with
the rule). Safe by default:

- it binds to 127.0.0.1 and, without a token, answers only requests addressed to a loopback name;
  another address needs a token that is hard to guess (--token or VIDGEN_TOKEN), and then every
  request must carry it (`Authorization: Bearer T`, or the cookie the login form sets); wrong
  tokens are rate-limited per peer address (vidgen.queue.access checks all this first);
- no CORS headers, request bodies of at most `max_body` bytes (413);
- every file a submitted config reads or writes (config, images, model files, LoRAs, outputs) must
  lie inside the configured roots, symbolic links resolved (422 otherwise), and the API serves no
  file outside them;
- every write action is logged in the job's log with the time and the client's address;
- malformed input (a header that is not UTF-8, an id beyond 64 bits, NUL or a lone surrogate in a
  string, JSON nested too deep, ...) is a 4xx with a one-line JSON error, never a 500; an
  unexpected error is a 500 with a one-line JSON body (its traceback goes to the service's log).

Built on Starlette (the `serve` extra): a small ASGI toolkit, well kept, with a test client.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

from ..errors import ConfigError, GuardrailBlocked, InputError, PackageMissing, VidgenError, install_hint
from ..paths import preview_path
from . import api
from .access import (COOKIE, INTERNAL, MAX_DEPTH, Failures, Guard, check_json, no_constants, peer, same,
                     session_value, token_problem)
from .jobs import Job, JobState, _sqlite_int
from .ledger import Ledger
from .workflow import _is_repo_id

SEED_FIXED = "seed: a job's seed is fixed when it is queued, so every attempt renders the same clip; give an integer"
"""An edit that would leave a queued job's seed null (a retry could then render another clip)."""

log = logging.getLogger("vidgen")

MAX_BODY = 1 << 20
STATIC = Path(__file__).parent / "static"
ACTIONS = ("cancel", "pause", "resume", "retry")
EDITABLE = ("prompt", "seed", "overrides")
# Keys (the last part of a dotted key) whose values name files a submission reads; `path` only under
# model and loras (output.path is written, not read). All are checked against the roots, and for
# being a regular file or folder, before any is opened, so a missing file and one outside the roots
# get the same answer, and a FIFO or device never blocks a thread.
READ_KEYS = ("config", "blocklists", "engine_cache", "image", "last_image", "colour_reference", "transformer",
             "transformer_2", "text_encoder", "vae", "tokenizer")
READ_PATHS = (("model", "path"), ("loras", "path"))
EVENT_BACKLOG = 256                                      # events kept for one stream client; then it resyncs
MAX_MODEL_FILES = 10_000                                 # entries of a model folder checked for special files


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
        self.subscribers: set[_Subscriber] = set()
        self.failures = Failures()
        self.poller: asyncio.Task | None = None
        self.live = True                # the poller's last ledger read worked

    def public(self, text: str) -> str:
        """`text` without the ledger's path (the API does not say where its files are)."""
        for path in {str(self.ledger.path), os.path.abspath(self.ledger.path)}:
            text = text.replace(f" in {path}", "").replace(f"the queue ledger {path}", "the queue ledger")
            text = text.replace(path, "the queue ledger")
        return text

    # --------------------------------------------------------------------------------- paths

    def inside(self, path: str | os.PathLike) -> bool:
        p = Path(path).expanduser()
        p = (p if p.is_absolute() else Path.cwd() / p).resolve()
        return any(p == r or p.is_relative_to(r) for r in self.roots)

    def outside(self, path: str) -> str:
        return f"{path!r} is outside the service's roots ({', '.join(map(str, self.roots))})"

    def readable(self, paths: list[str], folders: bool = True) -> list[str]:
        """What is wrong with reading `paths`: outside the roots (said alike whether or not it
        exists, so the answer tells nothing about files outside), or not a regular file or folder
        (a FIFO, socket or device, which would block or never end). Only stat(), which never blocks."""
        out = []
        for path in paths:
            if not self.inside(path):
                out.append(self.outside(path))
            elif (why := _special(path, folders)) is not None:
                out.append(why)
        return out

    def confine(self, specs) -> list[str]:
        """Every file the planned jobs read or write that lies outside the roots, and every file they
        read (a model folder's files too) that is not a regular file."""
        out = []
        for spec in specs:
            reads, writes, folders = [], [], []
            if spec.kind == "render":
                cfg = spec.payload
                model, output = cfg.get("model", {}), cfg.get("output", {})
                reads += [model.get(k) for k in ("transformer", "transformer_2", "text_encoder", "vae", "tokenizer")]
                if model.get("path") and not _is_repo_id(model["path"]):     # a repo id names the model cache
                    reads.append(model["path"])
                    folders.append(model["path"])
                reads += [cfg.get("image"), cfg.get("last_image"), output.get("colour_reference")]
                writes.append(output.get("path"))
                reads += [lora.get("path") for lora in cfg.get("loras") or []]
                guard = cfg.get("guard") or {}
                reads += [b for b in guard.get("blocklists") or [] if b != "default"]
                writes.append(guard.get("engine_cache"))
            else:
                writes.append(spec.payload.get("output"))
                reads += spec.payload.get("inputs", [])
            where = spec.name or spec.kind
            out += [f"{where}: {self.outside(p)}" for p in writes if isinstance(p, str) and p and not self.inside(p)]
            out += [f"{where}: {why}" for why in self.readable([p for p in reads if isinstance(p, str) and p])]
            out += [f"{where}: {why}" for f in folders if self.inside(f) and (why := _special_inside(f))]
        return out

    # --------------------------------------------------------------------------------- events

    def snapshot(self) -> dict[int, dict]:
        return {j.id: job_json(j) for j in self.ledger.jobs()}

    def state(self) -> tuple[dict[int, dict], bool]:
        return self.snapshot(), self.ledger.is_paused()

    async def poll(self, last: dict[int, dict], paused: bool) -> None:
        """One poller for every /api/events client: the ledger read every poll_s, changes since
        (`last`, `paused`) sent to all. Only changes: a client reads the list itself (GET /api/jobs)
        once its stream is open, and the baseline was taken before that. A failed read (a busy or
        briefly unreadable ledger) is logged and tried again next time; the clients are told
        (`status` {"live": false}) until a read works again."""
        try:
            while self.subscribers:
                await asyncio.sleep(self.poll_s)
                try:
                    now, state = await asyncio.to_thread(self.state)
                except Exception as e:      # noqa: BLE001 - the stream outlives a failed read
                    if self.live:
                        log.warning("the event stream could not read the ledger (retrying every %.1f s): %s",
                                    self.poll_s, self.public(f"{type(e).__name__}: {e}".splitlines()[0]))
                        self.live = False
                        self.publish([("status", {"live": False, "error": "the queue ledger cannot be read now"})])
                    continue
                events = [("job", j) for i, j in now.items() if last.get(i) != j]
                events += [("removed", {"id": i}) for i in last if i not in now]
                if state != paused:
                    events.append(("queue", {"paused": state}))
                if not self.live:
                    self.live = True
                    events.append(("status", {"live": True}))
                last, paused = now, state
                self.publish(events)
        finally:
            self.poller = None

    def publish(self, events: list[tuple[str, dict]]) -> None:
        for sub in list(self.subscribers):
            for e in events:
                sub.offer(e)


class _Subscriber:
    """One /api/events client's backlog, bounded: a client that falls EVENT_BACKLOG events behind
    (it reads slowly, or not at all) has them dropped for one `resync` event, after which it
    reads the list afresh. The server's memory per client stays bounded."""

    def __init__(self, size: int = EVENT_BACKLOG):
        self.queue: asyncio.Queue = asyncio.Queue(maxsize=size)
        self.dropped = 0

    def offer(self, event: tuple[str, dict]) -> None:
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            while not self.queue.empty():
                self.queue.get_nowait()
                self.dropped += 1
            self.queue.put_nowait(("resync", {"dropped": self.dropped}))


def _special(path: str, folders: bool = True) -> str | None:
    """Why `path` is not a file to read: a FIFO, socket or device (or a folder, unless `folders`).
    A missing path is fine here: the check that needs it says so."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode) or (folders and stat.S_ISDIR(mode)):
        return None
    kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if \
        stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file"
    return f"{path!r} is {kind}; name a regular file"


def _special_inside(folder: str) -> str | None:
    """The first entry of a model folder (its subfolders too) that is a FIFO, socket or device."""
    if not os.path.isdir(folder):
        return None
    seen, todo = 0, [folder]
    while todo and seen < MAX_MODEL_FILES:
        try:
            with os.scandir(todo.pop()) as entries:
                for entry in entries:
                    seen += 1
                    if entry.is_dir(follow_symlinks=False):
                        todo.append(entry.path)
                    elif (why := _special(entry.path, folders=True)) is not None:
                        return f"in the model folder {folder!r}: {why}"
        except OSError:
            continue
    return None


def _log(svc: Service, job_id: int, action: str, request) -> None:
    svc.ledger.log(job_id, f"{time.strftime('%Y-%m-%d %H:%M:%S')} {action} by {peer(request.scope)} (HTTP)")


def create_app(db: str | os.PathLike, *, roots: list[str | os.PathLike] = (), token: str | None = None,
               max_body: int = MAX_BODY, poll_s: float = 0.5):
    """The ASGI app of the service (Starlette)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import (FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response,
                                     StreamingResponse)
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    svc = Service(db, list(roots), token, max_body, poll_s)

    def error(status: int, message: str, **extra) -> JSONResponse:
        if "problems" in extra:
            extra["problems"] = [svc.public(str(p)) for p in extra["problems"]]
        return JSONResponse({"error": svc.public(message), **extra}, status_code=status)

    def ledger_error(e: InputError) -> JSONResponse:
        return error(404 if str(e).startswith("no job #") else 409, str(e))

    async def body(request: Request) -> Any:
        raw = await request.body()
        try:
            data = json.loads(raw or b"{}", parse_constant=no_constants)
        except (ValueError, RecursionError):        # not JSON, not UTF-8, NaN, or nested past the parser's stack
            raise ConfigError("the request body is not JSON (UTF-8, no NaN or Infinity, nested at most "
                              f"{MAX_DEPTH} levels)") from None
        if problems := check_json(data):
            raise ConfigError(problems)
        return data

    def overrides_of(data: dict) -> list[str]:
        overrides = data.get("overrides") or []
        if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
            raise ConfigError("overrides: give a list of KEY=VALUE strings")
        return overrides

    def jobs(request: Request):
        state, group = request.query_params.get("state"), request.query_params.get("workflow")
        try:
            found = svc.ledger.jobs(state, group)
        except InputError as e:
            return error(422, str(e))
        return JSONResponse({"jobs": [job_json(j) for j in found], "paused": svc.ledger.is_paused()})

    def job(request: Request):
        try:
            j = svc.ledger.get(request.path_params["id"])
        except InputError as e:
            return ledger_error(e)
        return JSONResponse({**job_json(j), "payload": j.payload, "attempt_history": svc.ledger.history(j.id)})

    def logs(request: Request):
        try:
            lines = svc.ledger.logs(request.path_params["id"])
        except InputError as e:
            return ledger_error(e)
        return JSONResponse({"logs": [{"attempt": a, "time": t, "text": x} for a, t, x in lines]})

    async def submit(request: Request):
        try:
            data = await body(request)
            if not isinstance(data, dict) or len({"config", "workflow"} & set(data)) != 1:
                raise ConfigError('give {"config": PATH_OR_MAPPING, "overrides": [...]} or {"workflow": PATH_OR_MAPPING}')
            overrides = overrides_of(data)
            source = data.get("config", data.get("workflow"))
            specs = await asyncio.to_thread(_plan, svc, source, "workflow" in data, overrides)
            if bad := await asyncio.to_thread(svc.confine, specs):     # stat calls, a model folder's walk
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
        job_id, action = request.path_params["id"], request.path_params["action"]
        if action not in ACTIONS:
            return error(404, f"no action {action[:40]!r}; use one of {', '.join(ACTIONS)}")
        try:
            result = getattr(api, action)(svc.ledger, job_id)
        except InputError as e:
            return ledger_error(e)
        _log(svc, job_id, action, request)
        return JSONResponse({"id": job_id, "result": result.value if isinstance(result, JobState) else result,
                             "state": svc.ledger.get(job_id).state.value})

    async def edit(request: Request):
        job_id = request.path_params["id"]
        try:
            data = await body(request)
            if not isinstance(data, dict) or not data or set(data) - {"priority", *EDITABLE}:
                raise ConfigError(f"give priority, or {', '.join(EDITABLE)} of a job that has not started")
            priority = data.get("priority")
            if priority is not None and not _sqlite_int(priority):
                raise ConfigError(f"priority: give an integer from {-2**63} to {2**63 - 1} (higher runs first)")
            if "seed" in data and data["seed"] is None:
                raise ConfigError(SEED_FIXED)
            overrides_of(data)
            current = svc.ledger.get(job_id)
            payload = output = None
            if set(data) & set(EDITABLE):
                ran = current.attempts or svc.ledger.history(job_id)      # a paused job may have run already
                if ran or current.state.value not in ("queued", "waiting-on-deps", "paused"):
                    return error(409, f"job #{job_id} is {current.state.value} and has started"
                                      "; only a job that has not started can be edited")
                if current.kind != "render":
                    raise ConfigError(f"job #{job_id} is a {current.kind} job; only render jobs have a prompt and seed")
                payload, output = await asyncio.to_thread(_edited, svc, current, data)
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
            return error(404, f"no queue action {action[:40]!r}; use pause or resume")
        getattr(svc.ledger, action)()
        log.info("%s queue %s by %s (HTTP)", time.strftime("%Y-%m-%d %H:%M:%S"), action, peer(request.scope))
        return JSONResponse({"paused": svc.ledger.is_paused()})

    async def events(request: Request):
        sub = _Subscriber()
        svc.subscribers.add(sub)
        if svc.poller is None:      # its baseline before this stream opens: nothing after it is missed
            try:
                baseline = await asyncio.to_thread(svc.state)
            except Exception:
                svc.subscribers.discard(sub)
                raise
            if svc.poller is None:
                svc.poller = asyncio.create_task(svc.poll(*baseline))

        async def stream():
            try:
                yield ": vidgen events\n\n"
                if not svc.live:
                    yield f"event: status\ndata: {json.dumps({'live': False})}\n\n"
                while not await request.is_disconnected():
                    try:
                        kind, data = await asyncio.wait_for(sub.queue.get(), timeout=15)
                        yield f"event: {kind}\ndata: {json.dumps(data)}\n\n"
                    except asyncio.TimeoutError:
                        yield "event: ping\ndata: {}\n\n"      # an event, so the page can tell a dead stream
            finally:
                svc.subscribers.discard(sub)
        return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    def preview(request: Request):
        try:
            j = svc.ledger.get(request.path_params["id"])
        except InputError as e:
            return ledger_error(e)
        candidates = []
        if j.output:        # a finished job's output; else the latest preview of its render, if any
            candidates = ([Path(j.output)] if j.state == JobState.SUCCEEDED else [preview_path(Path(j.output))]
                          if j.state in (JobState.RUNNING, JobState.PAUSED, JobState.QUEUED) else [])
        for path in candidates:
            if svc.inside(path) and path.is_file():
                return FileResponse(path)
        return error(404, f"job #{j.id} has no preview yet")

    def page(request: Request):
        return HTMLResponse((STATIC / "index.html").read_text())

    def login_form(request: Request):
        return HTMLResponse((STATIC / "login.html").read_text())

    async def login(request: Request):
        from urllib.parse import parse_qs      # the form is urlencoded: no multipart parser needed

        who = peer(request.scope)
        if svc.failures.locked(who):
            return HTMLResponse("<p>Too many wrong tokens; wait a minute.</p>", status_code=429)
        given = parse_qs((await request.body()).decode("utf-8", "replace")).get("token", [""])[0]
        if svc.token and same(given.encode("utf-8", "replace"), svc.token):
            response = RedirectResponse("/", status_code=303)
            response.set_cookie(COOKIE, session_value(svc.token), httponly=True, samesite="strict",
                                secure=request.url.scheme == "https")
            return response
        svc.failures.failed(who)
        return HTMLResponse((STATIC / "login.html").read_text().replace("<!--error-->", "<p>Wrong token.</p>"),
                            status_code=401)

    async def http_error(request: Request, exc: HTTPException):
        return error(exc.status_code, str(exc.detail))

    async def internal(request: Request, exc: Exception):
        # The client gets one line; the traceback goes to the service's log (_Guard logs what reaches it).
        return JSONResponse({"error": INTERNAL}, status_code=500)

    routes = [Route("/", page), Route("/login", login_form, methods=["GET"]), Route("/login", login, methods=["POST"]),
              Route("/api/jobs", jobs, methods=["GET"]), Route("/api/jobs", submit, methods=["POST"]),
              Route("/api/jobs/{id:int}", job, methods=["GET"]), Route("/api/jobs/{id:int}", edit, methods=["PATCH"]),
              Route("/api/jobs/{id:int}/logs", logs), Route("/api/jobs/{id:int}/preview", preview),
              Route("/api/jobs/{id:int}/{action}", act, methods=["POST"]),
              Route("/api/queue/{action}", queue_action, methods=["POST"]), Route("/api/events", events),
              Mount("/static", StaticFiles(directory=STATIC), name="static")]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: internal})
    app.state.service = svc
    return Guard(app, svc, Response)


def _named_files(node: Any, overrides: list[str]) -> list[str]:
    """Every value, anywhere in a submitted config or workflow (and its overrides), under a key that
    names a file read while the job is planned or checked (READ_KEYS, READ_PATHS). Dotted keys
    count as written (`model.path: ...` in a workflow's defaults)."""
    found: list[Any] = []

    def reads(key: str) -> bool:
        parts = [p for p in key.split(".") if p]
        return bool(parts) and (parts[-1] in READ_KEYS or tuple(parts[-2:]) in READ_PATHS)

    def take(key: str, value: Any) -> None:
        if isinstance(value, list):
            found.extend(v for v in value if isinstance(v, str))
        elif isinstance(value, str) and not (key.split(".")[-1] == "path" and _is_repo_id(value)):
            found.append(value)

    from ..presets import override_values

    todo: list[tuple[str, Any]] = [("", node), ("", override_values(overrides))]     # as the config will read them
    while todo:
        key, x = todo.pop()
        if isinstance(x, dict):
            for k, v in x.items():
                sub = f"{key}.{k}" if key else str(k)
                if reads(sub):
                    take(sub, v)
                todo.append((sub, v))
        elif isinstance(x, list):
            todo += [(key, v) for v in x]
    return [f for f in found if f and f != "default"]


def _plan(svc: Service, source: Any, workflow: bool, overrides: list[str]):
    """Plan a config or workflow given as a path (inside the roots) or as a mapping. Nothing outside
    the roots is read, and nothing but regular files: the files a submission names are checked
    (stat only) before any is opened."""
    if isinstance(source, str):
        if bad := svc.readable([source], folders=False):
            raise ConfigError(bad)
        import yaml

        try:
            raw = yaml.safe_load(Path(source).read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            raw = None          # planning reports what is wrong with the file
    else:
        raw = source
    if bad := svc.readable(_named_files(raw, overrides)):
        raise ConfigError(bad)
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
    """A render job's payload with a new prompt, seed or overrides, re-validated as a submit would be.
    Its seed stays fixed: an edit that leaves none (an override `seed=null`) is refused."""
    from ..config import to_dict
    from ..io import output_path
    from ..presets import load_config
    from .executor import check_specs
    from .jobs import JobSpec

    extra = {k: data[k] for k in ("prompt", "seed") if k in data}
    overrides = data.get("overrides") or []
    if bad := svc.readable(_named_files(extra, overrides)):
        raise ConfigError(bad)
    cfg = load_config({**job.payload, **extra}, overrides)
    if cfg.seed is None:
        raise ConfigError(SEED_FIXED)
    output = str(output_path(cfg.output.path, cfg.seed, cfg.prompt))     # a new seed or prompt may name a new file
    spec = JobSpec(kind="render", payload=to_dict(cfg), name=job.name, output=output)
    if bad := svc.confine([spec]):
        raise ConfigError(bad)
    check_specs([spec])
    return spec.payload, output      # the ledger refuses, in its update, an output another live job's files clash with


def serve(db: str | os.PathLike, *, host: str = "127.0.0.1", port: int = 8765, roots=(), token: str | None = None) -> None:
    """Run the service with uvicorn (blocking). Another address than loopback needs a good token."""
    token = token or os.environ.get("VIDGEN_TOKEN") or None
    if why := token_problem(token, host):
        raise InputError(why)
    try:
        import uvicorn
    except ImportError:
        raise PackageMissing(f"the service needs its extra: {install_hint('serve')}") from None
    app = create_app(db, roots=list(roots), token=token)
    import gc

    # The modules loaded by now (torch among them) are hundreds of thousands of long-lived objects: kept
    # out of the collector's full passes, which otherwise stall a request now and then (~0.25 s).
    gc.freeze()
    # proxy_headers=False: the peer address (what wrong tokens are counted by) is the socket's, never an
    # X-Forwarded-For that any client can send.
    uvicorn.run(app, host=host, port=port, log_level="warning", proxy_headers=False)
