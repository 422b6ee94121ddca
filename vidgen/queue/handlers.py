"""The queue service's routes: one module-level handler per endpoint (vidgen.queue.service builds
the app from ROUTES, behind access.Guard). Each handler takes the request and reaches the
service's state (ledger, roots, token, event stream) through `request.app.state.service`.

This module needs Starlette (the `serve` extra); the service imports it only when it builds an app.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..errors import ConfigError, GuardrailBlocked, InputError, VidgenError
from ..paths import preview_path
from . import api, videos
from .access import COOKIE, INTERNAL, MAX_DEPTH, SEED_FIXED, check_json, no_constants, peer, same, session_value
from .jobs import JobState, _sqlite_int

log = logging.getLogger("vidgen")

STATIC = Path(__file__).parent / "static"
ACTIONS = ("cancel", "pause", "resume", "retry")
EDITABLE = ("prompt", "seed", "overrides")


def _svc(request: Request):
    return request.app.state.service


def error(request: Request, status: int, message: str, **extra) -> JSONResponse:
    """A one-line JSON error (its problems too) without the ledger's path."""
    svc = _svc(request)
    if "problems" in extra:
        extra["problems"] = [svc.public(str(p)) for p in extra["problems"]]
    return JSONResponse({"error": svc.public(message), **extra}, status_code=status)


def ledger_error(request: Request, e: InputError) -> JSONResponse:
    return error(request, 404 if str(e).startswith("no job #") else 409, str(e))


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


def _logged(request: Request, job_id: int, action: str) -> None:
    _svc(request).ledger.log(job_id, f"{time.strftime('%Y-%m-%d %H:%M:%S')} {action} by {peer(request.scope)} (HTTP)")


def jobs(request: Request):
    svc = _svc(request)
    state, group = request.query_params.get("state"), request.query_params.get("workflow")
    try:
        found = svc.ledger.jobs(state, group)
    except InputError as e:
        return error(request, 422, str(e))
    workers = svc.ledger.live_workers() if any(j.needs for j in found) else []
    return JSONResponse({"jobs": [svc.job_json(j, workers) for j in found], "paused": svc.ledger.is_paused()})


def job(request: Request):
    svc = _svc(request)
    try:
        j = svc.ledger.get(request.path_params["id"])
    except InputError as e:
        return ledger_error(request, e)
    return JSONResponse({**svc.job_json(j), "payload": j.payload, "attempt_history": svc.ledger.history(j.id)})


def logs(request: Request):
    try:
        lines = _svc(request).ledger.logs(request.path_params["id"])
    except InputError as e:
        return ledger_error(request, e)
    return JSONResponse({"logs": [{"attempt": a, "time": t, "text": x} for a, t, x in lines]})


async def planned(request: Request) -> list:
    """The jobs a submission's body ({config | workflow, overrides}) plans, inside the roots; ConfigError else."""
    svc = _svc(request)
    data = await body(request)
    if not isinstance(data, dict) or len({"config", "workflow"} & set(data)) != 1:
        raise ConfigError('give {"config": PATH_OR_MAPPING, "overrides": [...]} or {"workflow": PATH_OR_MAPPING}')
    overrides = overrides_of(data)
    source = data.get("config", data.get("workflow"))
    specs = await asyncio.to_thread(svc.plan, source, "workflow" in data, overrides)
    if bad := await asyncio.to_thread(svc.confine, specs):     # stat calls, a model folder's walk
        raise ConfigError(bad)
    return specs


async def submit(request: Request):
    svc = _svc(request)
    try:
        specs = await planned(request)
        ids = await asyncio.to_thread(api.submit_specs, svc.ledger, specs)
    except GuardrailBlocked as e:
        rule = str(e).split("rule '")[-1].split("'")[0] if "rule '" in str(e) else None
        return error(request, 403, str(e), rule=rule)
    except ConfigError as e:
        return error(request, 422, "invalid submission", problems=e.problems)
    except VidgenError as e:
        return error(request, 422, "invalid submission", problems=[str(e)])
    for i in ids:
        _logged(request, i, "submitted")
    return JSONResponse({"ids": ids}, status_code=201)


async def estimate(request: Request):
    """POST /api/estimate: a submission's body, planned and checked as a submit is, queued nothing: each job's
    predicted seconds and the film's (vidgen.queue.estimate)."""
    from .estimate import calibrate, estimate as predict

    svc = _svc(request)
    try:
        specs = await planned(request)
        await asyncio.to_thread(api.check_specs, specs)
        result = await asyncio.to_thread(lambda: predict(specs, calibrate(svc.ledger),
                                                         len(svc.ledger.live_workers()) or 1))
    except ConfigError as e:
        return error(request, 422, "invalid submission", problems=e.problems)
    except VidgenError as e:
        return error(request, 422, "invalid submission", problems=[str(e)])
    return JSONResponse(result)


def act(request: Request):
    svc = _svc(request)
    job_id, action = request.path_params["id"], request.path_params["action"]
    if action not in ACTIONS:
        return error(request, 404, f"no action {action[:40]!r}; use one of {', '.join(ACTIONS)}")
    try:
        result = getattr(api, action)(svc.ledger, job_id)
    except InputError as e:
        return ledger_error(request, e)
    _logged(request, job_id, action)
    return JSONResponse({"id": job_id, "result": result.value if isinstance(result, JobState) else result,
                         "state": svc.ledger.get(job_id).state.value})


REVIEW = {"approve": ("take",), "reroll": ("seed",), "reject": ("reason",)}
"""A shot's review (vidgen.queue.review), from the page or a client: action -> the body keys it takes."""


async def review(request: Request):
    """approve {take}, reroll {seed?}, reject {reason?}: recorded with the client's address as who decided."""
    svc, job_id, action = _svc(request), request.path_params["id"], request.url.path.rsplit("/", 1)[1]
    try:
        data = await body(request)
        if not isinstance(data, dict) or set(data) - set(REVIEW[action]):
            raise ConfigError(f"{action}: the body is {{{', '.join(REVIEW[action])}}}")
        value = data.get(REVIEW[action][0])
        if action == "reject":
            ok = value is None or isinstance(value, str)
        else:
            ok = _sqlite_int(value) or (action == "reroll" and value is None)
        if not ok:
            raise ConfigError(f"{action}: {REVIEW[action][0]} {value!r} is not "
                              f"{'text' if action == 'reject' else 'an integer'}")
        who = f"{peer(request.scope)} (HTTP)"
        result = await asyncio.to_thread({"approve": lambda: api.approve(svc.ledger, job_id, value, who),
                                          "reroll": lambda: api.reroll(svc.ledger, job_id, value),
                                          "reject": lambda: api.reject(svc.ledger, job_id, value or "rejected",
                                                                       who)}[action])
    except ConfigError as e:
        return error(request, 422, "invalid request", problems=e.problems)
    except InputError as e:
        return ledger_error(request, e)
    _logged(request, job_id, action + (f" take {value}" if action == "approve" else ""))
    return JSONResponse({"id": job_id, "result": result, "state": svc.ledger.get(job_id).state.value})


def _edit_request(data: Any) -> None:
    """Refuse an edit body that is not {priority, prompt, seed, overrides} with good values."""
    if not isinstance(data, dict) or not data or set(data) - {"priority", *EDITABLE}:
        raise ConfigError(f"give priority, or {', '.join(EDITABLE)} of a job that has not started")
    priority = data.get("priority")
    if priority is not None and not _sqlite_int(priority):
        raise ConfigError(f"priority: give an integer from {-2**63} to {2**63 - 1} (higher runs first)")
    if "seed" in data and data["seed"] is None:
        raise ConfigError(SEED_FIXED)
    overrides_of(data)


async def edit(request: Request):
    svc = _svc(request)
    job_id = request.path_params["id"]
    try:
        data = await body(request)
        _edit_request(data)
        current = svc.ledger.get(job_id)
        payload = output = None
        if set(data) & set(EDITABLE):
            ran = current.attempts or svc.ledger.history(job_id)      # a paused job may have run already
            if ran or current.state.value not in ("queued", "waiting-on-deps", "paused"):
                return error(request, 409, f"job #{job_id} is {current.state.value} and has started"
                                           "; only a job that has not started can be edited")
            if current.kind != "render":
                raise ConfigError(f"job #{job_id} is a {current.kind} job; only render jobs have a prompt and seed")
            payload, output = await asyncio.to_thread(svc.edited, current, data)
        svc.ledger.update(job_id, priority=data.get("priority"), payload=payload, output=output)
    except InputError as e:
        return ledger_error(request, e)
    except ConfigError as e:
        return error(request, 422, "invalid edit", problems=e.problems)
    except VidgenError as e:
        return error(request, 422, "invalid edit", problems=[str(e)])
    _logged(request, job_id, f"edited ({', '.join(sorted(data))})")
    return JSONResponse(svc.job_json(svc.ledger.get(job_id)))


def queue_action(request: Request):
    svc = _svc(request)
    action = request.path_params["action"]
    if action not in ("pause", "resume"):
        return error(request, 404, f"no queue action {action[:40]!r}; use pause or resume")
    getattr(svc.ledger, action)()
    log.info("%s queue %s by %s (HTTP)", time.strftime("%Y-%m-%d %H:%M:%S"), action, peer(request.scope))
    return JSONResponse({"paused": svc.ledger.is_paused()})


async def events(request: Request):
    svc = _svc(request)
    sub = await svc.subscribe()

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
    svc = _svc(request)
    try:
        j = svc.ledger.get(request.path_params["id"])
    except InputError as e:
        return ledger_error(request, e)
    candidates = []
    if j.output:        # a finished job's output; else the latest preview of its render, if any
        candidates = ([Path(j.output)] if j.state == JobState.SUCCEEDED else [preview_path(Path(j.output))]
                      if j.state in (JobState.RUNNING, JobState.PAUSED, JobState.QUEUED) else [])
    for path in candidates:
        if svc.inside(path) and path.is_file():
            return FileResponse(path)
    return error(request, 404, f"job #{j.id} has no preview yet")


def page(request: Request):
    return HTMLResponse((STATIC / "index.html").read_text())


def login_form(request: Request):
    return HTMLResponse((STATIC / "login.html").read_text())


async def login(request: Request):
    svc = _svc(request)
    who = peer(request.scope)
    if svc.failures.locked(who):
        return HTMLResponse("<p>Too many wrong tokens; wait a minute.</p>", status_code=429)
    # The form is urlencoded: no multipart parser needed.
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
    return error(request, exc.status_code, str(exc.detail))


async def internal(request: Request, exc: Exception):
    # The client gets one line; the traceback goes to the service's log (access.Guard logs what reaches it).
    return JSONResponse({"error": INTERNAL}, status_code=500)


ROUTES = [Route("/", page), Route("/login", login_form, methods=["GET"]), Route("/login", login, methods=["POST"]),
          Route("/api/jobs", jobs, methods=["GET"]), Route("/api/jobs", submit, methods=["POST"]),
          Route("/api/estimate", estimate, methods=["POST"]),
          Route("/api/jobs/{id:int}", job, methods=["GET"]), Route("/api/jobs/{id:int}", edit, methods=["PATCH"]),
          Route("/api/jobs/{id:int}/logs", logs), Route("/api/jobs/{id:int}/preview", preview),
          *(Route(f"/api/jobs/{{id:int}}/{a}", review, methods=["POST"]) for a in REVIEW),
          Route("/api/jobs/{id:int}/{action}", act, methods=["POST"]),
          Route("/api/queue/{action}", queue_action, methods=["POST"]), Route("/api/events", events),
          *videos.ROUTES, Mount("/static", StaticFiles(directory=STATIC), name="static")]
EXCEPTION_HANDLERS = {HTTPException: http_error, Exception: internal}
