"""An OpenAI-compatible video API (`/v1/videos`) over the queue: each video is one render job.

Clients written for OpenAI's Videos API (its SDKs, or plain HTTP in that shape) can drive the
service unchanged, so this module only translates; every decision stays with the queue:

- `model` is a registered name: the file stem of a YAML preset in the settings' presets folder
  (the shipped configs/ by default), looked up in that folder's listing, never joined into a path;
- `prompt`, `seconds` (-> num_frames at the preset's fps, the nearest 4k+1, the rounding said in the
  answer and the job's log), `size` and `input_reference` (saved inside a root, becomes `image`)
  are overrides of that preset, planned and checked exactly as `POST /api/jobs` checks a config
  (vidgen.queue.api): the same roots (Service.confine), the same preflight, the same 422 / 403;
- the output goes to the settings' output folder, which must lie inside the service's roots;
- ids are `video_<job id>`; the job's state is the video's status (STATUS), read on every request.

Errors have OpenAI's shape, one JSON line: {"error": {"message", "type", "param", "code"}} (a 422
adds `problems`). The access.Guard in front of the app checks the token for /v1 as for /api.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import json
import math
import os
import re
import secrets
import time
from email.parser import HeaderParser
from email.utils import collapse_rfc2231_value
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse
from starlette.routing import Route

from ..config import MAX_FRAMES, frames_for_seconds
from ..errors import ConfigError, GuardrailBlocked, InputError, VidgenError
from ..families import DEFAULT_PRESET
from ..io import literal, slug
from ..presets import PRESETS, load_config
from . import api
from .access import MAX_DEPTH, check_json, no_constants, peer
from .jobs import Job, JobState

GROUP = "videos-api"
"""The ledger group of the jobs this API made; only those are videos here."""
DEFAULT_MODEL = DEFAULT_PRESET
"""The default `model` when the presets folder has it (families.DEFAULT_PRESET)."""
FIELDS = ("prompt", "model", "seconds", "size", "input_reference")
STATUS = {JobState.QUEUED: "queued", JobState.WAITING: "queued", JobState.PAUSED: "queued",
          JobState.RUNNING: "in_progress", JobState.SUCCEEDED: "completed", JobState.FAILED: "failed",
          JobState.CANCELED: "failed", JobState.BLOCKED: "failed", JobState.AWAITING_REVIEW: "queued"}
ERROR_CODES = {JobState.FAILED: "render_failed", JobState.CANCELED: "canceled", JobState.BLOCKED: "blocked_by_guard"}
# Share of the progress bar per render stage, so the percentage never runs backwards between stages.
STAGES = {"encode": (0, 5), "denoise": (5, 90), "decode": (90, 99)}
IMAGES = ((b"\x89PNG\r\n\x1a\n", ".png"), (b"\xff\xd8\xff", ".jpg"))
_ID = re.compile(r"video_([1-9][0-9]{0,18})")
_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MAX_PARTS = 16                                          # form fields in one multipart body
LIST_LIMIT = (20, 100)                                  # default and largest page of GET /v1/videos


@dataclasses.dataclass(frozen=True)
class VideoSettings:
    """What /v1/videos may use: `presets`, the folder whose YAML presets are the models (by file stem;
    `base` and `*-base`, which others inherit from, are left out); `default_model` (None:
    DEFAULT_MODEL if the folder has it, else its only preset, else `model` is required);
    `output_dir`, where videos and uploaded images go (None: `videos` in the first root)."""

    presets: str | os.PathLike = PRESETS
    default_model: str | None = None
    output_dir: str | os.PathLike | None = None

    def models(self) -> dict[str, Path]:
        """The registered names and their preset files, read from the folder now (edits show at once)."""
        try:
            entries = sorted(Path(self.presets).iterdir(), key=lambda p: (p.stem, p.suffix))
        except OSError:
            return {}
        out: dict[str, Path] = {}
        for p in entries:           # x.yaml before x.yml: one file per name
            if p.suffix in (".yaml", ".yml") and _MODEL.fullmatch(p.stem) and p.stem != "base" \
                    and not p.stem.endswith("-base") and p.is_file():
                out.setdefault(p.stem, p)
        return out

    def default(self) -> str | None:
        models = self.models()
        if self.default_model is not None:
            return self.default_model
        return DEFAULT_MODEL if DEFAULT_MODEL in models else next(iter(models)) if len(models) == 1 else None


def configure(svc, settings: VideoSettings | None) -> VideoSettings:
    """`settings` with absolute folders, checked when the app is built: the output folder inside the
    service's roots, an explicit default model among the presets (InputError otherwise)."""
    s = settings or VideoSettings()
    out = Path(s.output_dir).expanduser() if s.output_dir is not None else svc.roots[0] / "videos"
    s = dataclasses.replace(s, presets=Path(s.presets).expanduser().resolve(), output_dir=Path(os.path.abspath(out)))
    if not svc.inside(s.output_dir):
        raise InputError(f"videos output_dir {str(s.output_dir)!r} is outside the service's roots "
                         f"({', '.join(map(str, svc.roots))})")
    if s.default_model is not None and s.default_model not in s.models():
        raise InputError(f"videos default_model {s.default_model!r} is not a preset in {s.presets}; "
                         f"allowed: {', '.join(s.models()) or 'none'}")
    return s


# ------------------------------------------------------------------------------------ answers

def _svc(request: Request):
    return request.app.state.service


def fail(request: Request, status: int, message: str, *, code: str, param: str | None = None,
         **extra) -> JSONResponse:
    """An error in OpenAI's shape, on one line, without the ledger's path."""
    svc = _svc(request)
    if "problems" in extra:
        extra["problems"] = [_line(svc.public(str(p))) for p in extra["problems"]]
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": _line(svc.public(message)), "type": kind, "param": param,
                                   "code": code, **extra}}, status_code=status)


def invalid(request: Request, problems: list[str], param: str | None = None) -> JSONResponse:
    return fail(request, 422, "invalid request: " + "; ".join(problems), code="invalid_request", param=param,
                problems=problems)


def _line(text: str) -> str:
    return " ".join(text.split("\n"))


def video_id(job_id: int) -> str:
    return f"video_{job_id}"


def job_id_of(text: str) -> int | None:
    """The job id in `video_<id>`, or None for anything else (a 64-bit id at most)."""
    m = _ID.fullmatch(text)
    return int(m.group(1)) if m and int(m.group(1)) < 2**63 else None


def video_job(request: Request) -> Job | JSONResponse:
    """The render job a path's video id names, or the 404 to send."""
    text = request.path_params["video_id"]
    job_id = job_id_of(text)
    try:
        job = _svc(request).ledger.get(job_id) if job_id is not None else None
    except InputError:
        job = None
    if job is None or job.group != GROUP or job.kind != "render":
        shown = text[:40].encode("ascii", "replace").decode()
        return fail(request, 404, f"no video {shown!r}; ids look like video_123", code="video_not_found",
                    param="video_id")
    return job


def progress(job: Job) -> int:
    if job.state == JobState.SUCCEEDED:
        return 100
    p = job.progress or {}
    low, high = STAGES.get(p.get("stage"), (0, 99))
    step, total = p.get("step"), p.get("total")
    done = step / total if isinstance(step, (int, float)) and isinstance(total, (int, float)) and total > 0 else 0
    return int(low + (high - low) * min(max(done, 0), 1))


def duration(frames: int, fps: int) -> str:
    return f"{frames / fps:g}"


def video_object(svc, job: Job, notes: list[str] = ()) -> dict:
    """The video object for `job`, with vidgen's own facts under `vidgen` (clients ignore unknown keys)."""
    p, status = job.payload, STATUS.get(job.state, "failed")
    error = None
    if status == "failed":
        what = (job.error or {JobState.CANCELED: "the job was canceled"}.get(job.state, "the render failed"))
        error = {"code": ERROR_CODES.get(job.state, "render_failed"), "message": _line(svc.public(what))}
    finished = int(job.finished) if job.finished is not None and status in ("completed", "failed") else None
    extra = {"job_id": job.id, "state": job.state.value, "num_frames": p.get("num_frames"), "fps": p.get("fps"),
             "seed": p.get("seed"), "failure_kind": job.failure_kind.value if job.failure_kind else None}
    return {"id": video_id(job.id), "object": "video", "created_at": int(job.created), "status": status,
            "model": job.name.partition("/")[0], "progress": progress(job),
            "seconds": duration(p.get("num_frames", 0), p.get("fps") or 1), "size": p.get("size"),
            "prompt": p.get("prompt"), "remixed_from_video_id": None, "completed_at": finished,
            "expires_at": None, "error": error, "vidgen": {**extra, **({"notes": list(notes)} if notes else {})}}


# ------------------------------------------------------------------------------------ requests

async def read_fields(request: Request) -> dict[str, Any]:
    """The create body as {field: value}, from JSON, multipart/form-data or a urlencoded form; a file
    part is (filename, bytes). ConfigError for a body that is none of them."""
    raw = await request.body()              # the Guard has bounded it by max_body already
    ctype = request.headers.get("content-type", "")
    kind = ctype.split(";")[0].strip().lower()
    if kind == "multipart/form-data":
        data = _multipart(raw, ctype)
    elif kind == "application/x-www-form-urlencoded":
        try:
            pairs = parse_qs(raw.decode("utf-8"), keep_blank_values=True, strict_parsing=bool(raw),
                             max_num_fields=MAX_PARTS)
        except (UnicodeDecodeError, ValueError):
            raise ConfigError("the form body is not valid UTF-8 urlencoded fields") from None
        if dup := [k for k, v in pairs.items() if len(v) > 1]:
            raise ConfigError(f"{dup[0][:40]!r}: given more than once")
        data = _nest({k: v[0] for k, v in pairs.items()})
    else:
        try:
            data = json.loads(raw or b"{}", parse_constant=no_constants)
        except (ValueError, RecursionError):
            raise ConfigError("the request body is not JSON (UTF-8, no NaN or Infinity, nested at most "
                              f"{MAX_DEPTH} levels), multipart/form-data or a urlencoded form") from None
    if problems := check_json(data if not isinstance(data, dict) else
                              {k: v for k, v in data.items() if not isinstance(v, tuple)}):
        raise ConfigError(problems)
    if not isinstance(data, dict):
        raise ConfigError(f"give an object with {', '.join(FIELDS)} (prompt is required)")
    return data


def _multipart(raw: bytes, ctype: str) -> dict[str, Any]:
    """multipart/form-data split at its delimiters (CRLF, `--`, the boundary; each part's headers read
    by the email package): text fields as UTF-8, file parts as (filename, bytes). No extra package."""
    boundary = _param(f"Content-Type: {ctype}", "boundary", "content-type")
    if not boundary or len(boundary) > 200:
        raise ConfigError("multipart/form-data needs a boundary in its Content-Type")
    chunks = (b"\r\n" + raw).split(b"\r\n--" + boundary.encode("latin-1"))
    if len(chunks) < 3 or not chunks[-1].startswith(b"--"):
        raise ConfigError("the multipart body is cut short (no closing boundary)")
    if len(chunks) - 2 > MAX_PARTS:
        raise ConfigError(f"the multipart body has more than {MAX_PARTS} parts")
    out: dict[str, Any] = {}
    for chunk in chunks[1:-1]:
        end = chunk.find(b"\r\n")             # the rest of the delimiter line: only spaces may follow it
        head, sep, body = chunk[end + 2:].partition(b"\r\n\r\n")
        if end < 0 or chunk[:end].strip(b" \t") or not sep:
            raise ConfigError("a multipart part is malformed (a boundary line, headers, a blank line, its content)")
        headers = head.decode("latin-1")
        name = _param(headers, "name", "content-disposition")
        if not name:
            raise ConfigError("a multipart part has no name (Content-Disposition: form-data; name=...)")
        if name in out:
            raise ConfigError(f"{name[:40]!r}: given more than once")
        filename = _param(headers, "filename", "content-disposition")
        if filename is not None:
            out[name] = (filename, body)
            continue
        try:
            out[name] = body.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError(f"{name[:40]!r}: not valid UTF-8") from None
    return _nest(out)


def _param(headers: str, key: str, header: str) -> str | None:
    value = HeaderParser().parsestr(headers + "\n\n").get_param(key, header=header)
    return None if value is None else collapse_rfc2231_value(value)


def _nest(fields: dict[str, Any]) -> dict[str, Any]:
    """`input_reference[image_url]` (how SDKs send an object in a form) as {"input_reference": {...}}."""
    out: dict[str, Any] = {}
    for key, value in fields.items():
        m = re.fullmatch(r"([a-z_]+)\[([a-z_]+)\]", key)
        if m and (m.group(1) not in out or isinstance(out[m.group(1)], dict)):
            out.setdefault(m.group(1), {})[m.group(2)] = value
        else:
            out[key] = value
    return out


def check_fields(data: dict, models: dict[str, Path], default: str | None) -> tuple[str, list[str]]:
    """The model's name, and every problem of the fields' names and types (not their values: the
    config checks those). An unknown model names the allowed ones."""
    problems = [f"{str(k)[:40]!r}: unknown field; allowed: {', '.join(FIELDS)}" for k in data if k not in FIELDS]
    prompt = data.get("prompt")
    if prompt is None:
        problems.append("prompt: is required; say what to render")
    elif not isinstance(prompt, str):
        problems.append("prompt: give a string")
    for key in ("model", "size"):
        if key in data and not isinstance(data[key], str):
            problems.append(f"{key}: give a string" + (", e.g. 1280x720" if key == "size" else ""))
    seconds = data.get("seconds")
    if "seconds" in data and (isinstance(seconds, bool) or not isinstance(seconds, (str, int, float))):
        problems.append("seconds: give a number of seconds as a string, e.g. \"4\"")
    model = data.get("model") if isinstance(data.get("model"), str) else default
    allowed = ", ".join(models) or "none (the service's presets folder has no presets)"
    if "model" not in data and default is None:
        problems.append(f"model: is required here (the service has no default); allowed: {allowed}")
    elif isinstance(model, str) and model not in models:
        problems.append(f"model: {model[:64]!r} is not a model of this service; allowed: {allowed}")
    return model, problems


def frames_for(seconds: Any, fps: int) -> tuple[int, str | None]:
    """`seconds` at `fps` as the nearest 4k+1 frames (what the VAE allows), and a note if that is not
    exactly the seconds asked for. ConfigError for a value that is not a positive length in range."""
    try:
        s = float(seconds.strip() if isinstance(seconds, str) else seconds)
    except ValueError:
        s = math.nan
    if not math.isfinite(s) or s <= 0:
        raise ConfigError(f"seconds: {str(seconds)[:40]!r} is not a positive number of seconds")
    if s * fps > MAX_FRAMES:
        raise ConfigError(f"seconds: {s:g} s at {fps} fps is more than {MAX_FRAMES} frames; give fewer seconds")
    frames, rounded = frames_for_seconds(s, fps)
    return frames, rounded and f"seconds: {rounded}"


def reference_image(value: Any) -> tuple[bytes, str]:
    """The bytes and file extension of `input_reference`: an uploaded file, or {"image_url": a data:
    URL}. This service fetches nothing, so a web URL or a file_id is refused."""
    if isinstance(value, tuple):
        data = value[1]
    elif isinstance(value, dict) and set(value) <= {"image_url", "file_id"} and isinstance(value.get("image_url"), str):
        url = value["image_url"]
        head, sep, payload = url.partition(",")
        if not (url.startswith("data:") and sep and head.endswith(";base64")):
            raise ConfigError("input_reference.image_url: give a data: URL (data:image/png;base64,...); this "
                              "service fetches no URLs")
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise ConfigError("input_reference.image_url: the data: URL is not valid base64") from None
    elif isinstance(value, dict) and "file_id" in value:
        raise ConfigError("input_reference.file_id: this service has no file store; upload the image "
                          "(multipart/form-data) or give {\"image_url\": \"data:image/png;base64,...\"}")
    else:
        raise ConfigError("input_reference: upload an image file (multipart/form-data) or give "
                          "{\"image_url\": \"data:image/png;base64,...\"}")
    ext = next((e for magic, e in IMAGES if data.startswith(magic)), None)
    if ext is None:
        raise ConfigError("input_reference: not a PNG or JPEG image")
    return data, ext


def save_upload(svc, folder: Path, name: str, data: bytes) -> Path:
    """Write an uploaded image as a new file inside the roots (never over an existing one, never
    through a link), the real folder checked just before the write."""
    for _ in range(2):      # before mkdir (no folder made outside), and after it (the folder as it now is)
        if not svc.inside(folder):
            raise ConfigError(f"input_reference: {svc.outside(str(folder))}")
        folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def submit(svc, settings: VideoSettings, model: str, data: dict) -> tuple[int, list[str]]:
    """Queue the render job of a create request (named `<model>/<prompt slug>`, in GROUP), planned
    and checked as POST /api/jobs does it; its id, and the notes to tell the client. A saved upload
    is removed if the job is refused."""
    from .workflow import plan_single      # torch and the model code: loaded on the first create, as submit does

    preset = settings.models()[model]
    token = secrets.token_hex(8)
    out = Path(settings.output_dir)
    overrides: dict[str, Any] = {"prompt": data["prompt"],
                                 "output": {"path": literal(str(out / f"video-{token}.mp4")), "root": str(out)}}
    if "size" in data:
        overrides["size"] = data["size"]
    notes: list[str] = []
    problems: list[str] = []
    if "seconds" in data:
        try:    # the preset's fps, with the request's other values merged in first
            fps = load_config(preset, overrides).fps
            overrides["num_frames"], note = frames_for(data["seconds"], fps)
            notes += [note] if note else []
        except ConfigError as e:
            problems += e.problems
    image = None
    if "input_reference" in data:
        try:
            blob, ext = reference_image(data["input_reference"])
            # crop keeps `size` exactly (centre-cropping the image), so the size reported is the size rendered
            overrides.update(image_fit="crop")
        except ConfigError as e:
            problems += e.problems
    if problems:
        raise ConfigError(problems)
    if "input_reference" in data:
        image = save_upload(svc, out / "inputs", f"{token}{ext}", blob)
        overrides["image"] = str(image)
    try:
        specs = plan_single(preset, overrides)
        for spec in specs:
            spec.name, spec.group = f"{model}/{slug(data['prompt'], 32)}", GROUP
        if bad := svc.confine(specs):
            raise ConfigError(bad)
        [job_id] = api.submit_specs(svc.ledger, specs)
        return job_id, notes
    except BaseException:
        if image is not None:
            image.unlink(missing_ok=True)       # our own upload, written a moment ago: no user's file
        raise


def _scrub(settings: VideoSettings, text: str) -> str:
    """`text` without the presets folder's path (the API does not say where its files are)."""
    return text.replace(str(settings.presets), "the presets folder")


# ------------------------------------------------------------------------------------ handlers

async def create(request: Request):
    svc, settings = _svc(request), request.app.state.videos
    try:
        data = await read_fields(request)
        model, problems = check_fields(data, settings.models(), settings.default())
        if problems:
            return invalid(request, problems, param=_param_of(problems))
        job_id, notes = await asyncio.to_thread(submit, svc, settings, model, data)
    except GuardrailBlocked as e:
        rule = str(e).split("rule '")[-1].split("'")[0] if "rule '" in str(e) else None
        return fail(request, 403, str(e), code="blocked_by_guard", param="prompt", rule=rule)
    except ConfigError as e:
        return invalid(request, [_scrub(settings, p) for p in e.problems], param=_param_of(e.problems))
    except VidgenError as e:
        return invalid(request, [_scrub(settings, str(e))])
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    svc.ledger.log(job_id, f"{stamp} submitted by {peer(request.scope)} (HTTP, POST /v1/videos as "
                           f"{video_id(job_id)}, model {model})")
    for note in notes:
        svc.ledger.log(job_id, f"{stamp} {note}")
    return JSONResponse(video_object(svc, svc.ledger.get(job_id), notes))


def _param_of(problems: list[str]) -> str | None:
    """The request field the first problem is about, as OpenAI's `param` says it."""
    key = problems[0].split(":")[0].split(".")[0].strip("'") if problems else ""
    return key if key in FIELDS else None


def retrieve(request: Request):
    job = video_job(request)
    return job if isinstance(job, JSONResponse) else JSONResponse(video_object(_svc(request), job))


def content(request: Request):
    job = video_job(request)
    if isinstance(job, JSONResponse):
        return job
    variant = request.query_params.get("variant", "video")
    if variant != "video":
        return fail(request, 422, f"variant: only 'video' is available here, not {variant[:40]!r}",
                    code="invalid_request", param="variant")
    status = STATUS.get(job.state, "failed")
    if status != "completed":
        # 409: the request is right but the video is not (yet) there; polling GET /v1/videos/{id} says when
        return fail(request, 409, f"{video_id(job.id)} is {status}; its content is there once it is completed",
                    code="video_not_ready")
    svc = _svc(request)
    path = Path(job.output or "")
    if not (job.output and svc.inside(path) and path.is_file()):
        return fail(request, 404, f"the file of {video_id(job.id)} is no longer there", code="video_content_missing")
    return FileResponse(path, media_type="video/mp4", filename=f"{video_id(job.id)}.mp4")


def listing(request: Request):
    svc, q = _svc(request), request.query_params
    problems = [f"{k[:40]!r}: unknown query parameter; allowed: after, limit, order" for k in q
                if k not in ("after", "limit", "order")]
    order, limit, after = q.get("order", "desc"), q.get("limit", str(LIST_LIMIT[0])), q.get("after")
    if order not in ("asc", "desc"):
        problems.append(f"order: give asc or desc, not {order[:20]!r}")
    if not (limit.isascii() and limit.isdigit() and int(limit) <= LIST_LIMIT[1]):
        problems.append(f"limit: give an integer from 0 to {LIST_LIMIT[1]}")
    after_id = job_id_of(after) if after is not None else None
    if after is not None and after_id is None:
        problems.append("after: give a video id (video_123)")
    if problems:
        return invalid(request, problems)
    jobs = [j for j in svc.ledger.jobs(None, GROUP) if j.kind == "render"]
    if order == "desc":
        jobs.reverse()
    if after_id is not None:
        jobs = [j for j in jobs if (j.id < after_id if order == "desc" else j.id > after_id)]
    page = jobs[:int(limit)]
    data = [video_object(svc, j) for j in page]
    return JSONResponse({"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                         "last_id": data[-1]["id"] if data else None, "has_more": len(jobs) > len(page)})


def delete(request: Request):
    """Cancel the video's job; its files and its ledger entry stay (this service deletes no files), so
    `deleted` is false and the video reads as failed (canceled) afterwards."""
    job = video_job(request)
    if isinstance(job, JSONResponse):
        return job
    svc = _svc(request)
    try:
        state = api.cancel(svc.ledger, job.id)
    except InputError:
        return fail(request, 409, f"{video_id(job.id)} is {STATUS.get(job.state, 'failed')} ({job.state.value}); "
                                  "there is nothing to cancel, and this service deletes no files",
                    code="video_not_cancelable")
    svc.ledger.log(job.id, f"{time.strftime('%Y-%m-%d %H:%M:%S')} cancel by {peer(request.scope)} "
                           f"(HTTP, DELETE /v1/videos/{video_id(job.id)})")
    return JSONResponse({"id": video_id(job.id), "object": "video.deleted", "deleted": False,
                         "vidgen": {"state": state.value, "files_kept": True}})


ROUTES = [Route("/v1/videos", create, methods=["POST"]), Route("/v1/videos", listing, methods=["GET"]),
          Route("/v1/videos/{video_id}", retrieve, methods=["GET"]),
          Route("/v1/videos/{video_id}", delete, methods=["DELETE"]),
          Route("/v1/videos/{video_id}/content", content, methods=["GET"])]
