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
import dataclasses
import gc
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import yaml

from ..config import FileMark, RenderConfig, to_dict
from ..config_files import file_fields, file_marks
from ..errors import ConfigError, InputError, PackageMissing, install_hint
from ..folders import special_files
from ..io import output_path
from ..paths import preview_path
from ..presets import load_config, override_values
from ..records import path_problem
from . import api
from .access import SEED_FIXED, Failures, Guard, token_problem
from .jobs import Job, JobSpec, JobState
from .ledger import Ledger
from .schedule import unplaceable
from .workflow import load_workflow, plan_jobs, plan_single

log = logging.getLogger("vidgen")

MAX_BODY = 1 << 20
EVENT_BACKLOG = 256                                      # events kept for one stream client; then it resyncs
PRESET = FileMark("read")
"""A workflow's `defaults.config` (or a config's `config:`): the preset file planning reads."""
# path_problem's names for what is not a regular file, as the service's answers say them.
NOT_REGULAR = {"a folder": "a folder", "a named pipe (FIFO)": "a FIFO", "a socket": "a socket",
               "a character device": "a device", "a block device": "a device", "a special file": "not a regular file"}


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
            "lease_expires": job.lease_expires, "preview": _preview_version(job), "needs": job.needs}


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
            elif (why := _not_regular(path, folders)) is not None:
                out.append(why)
        return out

    def confine(self, specs) -> list[str]:
        """Every file the planned jobs read or write that lies outside the roots, and every file they
        read (a model folder's files too) that is not a regular file."""
        out = []
        for spec in specs:
            reads, writes, folders = [], [], []
            if spec.kind == "render":       # the files the schema marks (config.file_fields)
                for _, value, kind in file_fields(spec.payload):
                    (writes if kind == "write" else reads).append(value)
                    # a model folder, or a control/source clip given as a folder of PNG frames
                    folders += [value] if kind == "folder" or (kind == "video" and os.path.isdir(value)) else []
            else:
                writes.append(spec.payload.get("output"))
                reads += spec.payload.get("inputs", [])
                # a stitch's track and signing key and certificate (steps.stitch.audio, .provenance)
                reads += [(spec.payload.get("audio") or {}).get("path"), *(spec.payload.get("provenance") or {}).values()]
            where = spec.name or spec.kind
            out += [f"{where}: {self.outside(p)}" for p in writes if isinstance(p, str) and p and not self.inside(p)]
            out += [f"{where}: {why}" for why in self.readable([p for p in reads if isinstance(p, str) and p])]
            out += [f"{where}: {why}" for f in folders if self.inside(f) and (why := _not_regular_inside(f))]
        return out

    def plan(self, source: Any, workflow: bool, overrides: list[str]) -> list[JobSpec]:
        """Plan a config or workflow given as a path (inside the roots) or as a mapping. Nothing outside
        the roots is read, and nothing but regular files: the files a submission names are checked
        (stat only) before any is opened."""
        if isinstance(source, str):
            if bad := self.readable([source], folders=False):
                raise ConfigError(bad)
            try:
                raw = yaml.safe_load(Path(source).read_text())
            except (OSError, UnicodeDecodeError, yaml.YAMLError):
                raw = None          # planning reports what is wrong with the file
        else:
            raw = source
        if bad := self.readable(_named_files(raw, overrides)):
            raise ConfigError(bad)
        if isinstance(source, str):
            return api.plan(source, overrides)
        if not isinstance(source, dict):
            raise ConfigError("config / workflow: give a file path or a mapping")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / ("workflow.json" if workflow else "config.json")
            path.write_text(json.dumps(source))
            return plan_jobs(load_workflow(path, overrides)) if workflow else plan_single(path, overrides)

    def edited(self, job: Job, data: dict) -> tuple[dict, str]:
        """A render job's payload with a new prompt, seed or overrides, re-validated as a submit would
        be, and its output. Its seed stays fixed: an edit that leaves none (`seed=null`) is refused."""
        extra = {k: data[k] for k in ("prompt", "seed") if k in data}
        overrides = data.get("overrides") or []
        if bad := self.readable(_named_files(extra, overrides)):
            raise ConfigError(bad)
        cfg = load_config({**job.payload, **extra}, overrides)
        if cfg.seed is None:
            raise ConfigError(SEED_FIXED)
        output = str(output_path(cfg.output.path, cfg.seed, cfg.prompt))     # a new seed or prompt may name a new file
        spec = JobSpec(kind="render", payload=to_dict(cfg), name=job.name, output=output)
        if bad := self.confine([spec]):
            raise ConfigError(bad)
        api.check_specs([spec])
        return spec.payload, output      # the ledger refuses, in its update, an output another live job's files clash with

    # --------------------------------------------------------------------------------- events

    def job_json(self, job: Job, workers: list | None = None) -> dict:
        """What the handlers and events send for a job: with, for a queued job no live worker can take,
        why (`waits`: "needs 22 GiB; largest worker 12 GiB")."""
        out = job_json(job)
        if job.needs and job.state == JobState.QUEUED:
            out["waits"] = unplaceable(job.needs, self.ledger.live_workers() if workers is None else workers)
        return out

    async def subscribe(self) -> _Subscriber:
        """A new /api/events client's backlog; the first one starts the poller, its baseline taken
        before the stream opens, so nothing after it is missed."""
        sub = _Subscriber()
        self.subscribers.add(sub)
        if self.poller is None:
            try:
                baseline = await asyncio.to_thread(self.state)
            except Exception:
                self.subscribers.discard(sub)
                raise
            if self.poller is None:
                self.poller = asyncio.create_task(self.poll(*baseline))
        return sub

    def snapshot(self) -> dict[int, dict]:
        jobs = self.ledger.jobs()
        workers = self.ledger.live_workers() if any(j.needs for j in jobs) else []
        return {j.id: self.job_json(j, workers) for j in jobs}

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


def _not_regular(path: str, folders: bool = True) -> str | None:
    """Why `path` is not a file to read: a FIFO, socket or device (or a folder, unless `folders`).
    A missing path is fine here: the check that needs it says so."""
    why = path_problem(path, "file or folder" if folders else "file") or ""
    what = NOT_REGULAR.get(why.removeprefix("is ").split(",")[0])
    return None if what is None else f"{path!r} is {what}; name a regular file"


def _not_regular_inside(folder: str) -> str | None:
    """The first entry of a model folder (its subfolders too) that is a FIFO, socket or device."""
    if not (found := special_files(Path(folder))):
        return None
    name, _, what = found[0].rpartition(" is ")
    return (f"in the model folder {folder!r}: {os.path.join(folder, name)!r} is "
            f"{NOT_REGULAR.get(what, 'not a regular file')}; name a regular file")


def create_app(db: str | os.PathLike, *, roots: list[str | os.PathLike] = (), token: str | None = None,
               max_body: int = MAX_BODY, poll_s: float = 0.5, videos=None):
    """The ASGI app of the service: vidgen.queue.handlers' routes (Starlette, the `serve` extra, imported
    only here) behind access.Guard, the state in `app.state.service`. `videos`: the /v1/videos settings
    (vidgen.queue.videos.VideoSettings; None: the shipped presets, output in `videos` under the first root)."""
    from starlette.applications import Starlette
    from starlette.responses import Response

    from . import handlers, videos as videos_api

    svc = Service(db, list(roots), token, max_body, poll_s)
    app = Starlette(routes=handlers.ROUTES, exception_handlers=handlers.EXCEPTION_HANDLERS)
    app.state.service = svc
    app.state.videos = videos_api.configure(svc, videos)
    return Guard(app, svc, Response)


def _named_files(node: Any, overrides: list[str]) -> list[str]:
    """Every value, anywhere in a submitted config or workflow (and its overrides), under a key that
    names a file read while the job is planned or checked: the schema's file fields but the written
    output (config.file_marks; matched by name, or by section and name where a written field has the
    name too: model.path, not output.path) and the preset (PRESET). Dotted keys count as written
    (`model.path: ...` in a workflow's defaults)."""
    marks = _read_marks()
    found: list[str] = []
    todo: list[tuple[str, Any]] = [("", node), ("", override_values(overrides))]     # as the config will read them
    while todo:
        key, x = todo.pop()
        if isinstance(x, dict):
            for k, v in x.items():
                sub = f"{key}.{k}" if key else str(k)
                parts = tuple(p for p in sub.split(".") if p)
                if parts and (mark := marks.get(parts[-1]) or marks.get(parts[-2:])):
                    found += [f for f in (v if isinstance(v, list) else [v]) if mark.names_file(f)]
                todo.append((sub, v))
        elif isinstance(x, list):
            todo += [(key, v) for v in x]
    return found


def _read_marks() -> dict[str | tuple[str, ...], FileMark]:
    """The marks of the files planning reads, by field name and by (section, name)."""
    written = {key[-1] for key, mark in file_marks().items() if mark.kind == "write"} | _plain_names(RenderConfig)
    out: dict[str | tuple[str, ...], FileMark] = {"config": PRESET}
    for key, mark in file_marks().items():
        if mark.kind != "write":
            parts = tuple(p for p in key if p is not None)
            out[parts[-2:]] = mark
            if parts[-1] not in written:
                out[parts[-1]] = mark
    return out


def _plain_names(schema: type) -> set[str]:
    """Names of the schema's fields that name no file anywhere (memory.weights beside output.retime.weights):
    a file field of the same name is then matched by (section, name) only."""
    out, hints = set(), get_type_hints(schema)
    for f in dataclasses.fields(schema):
        item = get_args(hints[f.name])[0] if get_origin(hints[f.name]) is list else hints[f.name]
        if dataclasses.is_dataclass(item):
            out |= _plain_names(item)
        elif "file" not in f.metadata:
            out.add(f.name)
    return out


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

    # The modules loaded by now (torch among them) are hundreds of thousands of long-lived objects: kept
    # out of the collector's full passes, which otherwise stall a request now and then (~0.25 s).
    gc.freeze()
    # proxy_headers=False: the peer address (what wrong tokens are counted by) is the socket's, never an
    # X-Forwarded-For that any client can send.
    uvicorn.run(app, host=host, port=port, log_level="warning", proxy_headers=False)
