"""What a render can be continued from: sampler checkpoints and the latents file.

A checkpoint (`NAME.resume.safetensors`, beside the output) holds the sampler state (latents,
the solver's multistep history, the next step) and, in its metadata, the resolved config (seed and
output path filled in). The solvers draw no random numbers after the initial noise, so continuing
from the saved state gives the same latents, bit for bit, as an uninterrupted render.

The latents file (`NAME.latents.safetensors`) holds the sampled latents, written before the decode
so a failed decode never loses the sampling (`vidgen decode` finishes the render from it).

Where a render starts is decided here too, with what becomes of a checkpoint that cannot continue
it: `start_render` for `--resume`, `start_job` for a queue job (what its earlier attempts left at
the output's names).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save as serialise

from . import __version__
from .animate_config import segment_latent_shape
from .config import RenderConfig, to_dict
from .errors import ConfigError, InputError
from .io import atomic_write_bytes, literal, output_path, put_bytes
from .lora import sha256_of
from .paths import OutputSet, has_placeholders, latents_path, resume_path, sidecar_path
from .presets import load_config
from .records import check_safetensors, damaged, metadata_json, path_problem, safe_name
from .sampling import SamplerState
from .sources import inspect

log = logging.getLogger("vidgen")

FORMAT = "vidgen-resume-1"
FIX = "delete it, or give another checkpoint, or start the render again without --resume"
"""What to do about a damaged checkpoint (the end of its error message)."""

# The settings that decide the sampled latents: a checkpoint only continues a render that agrees on all.
IDENTITY = ("model.path", "model.transformer", "model.transformer_2", "model.text_encoder", "model.vae", "model.variant",
            "model.dtype", "model.max_sequence_length", "prompt", "negative_prompt",
            "image", "last_image", "image_fit", "size", "num_frames", "seed", "sampling.solver", "sampling.schedule",
            "sampling.steps", "sampling.shift", "sampling.guidance_scale", "sampling.guidance_scale_2",
            "sampling.boundary")


def write_safetensors(path: Path | OutputSet, tensors: dict, metadata: dict[str, str], failure: str, *,
                      root: str | None = None, role: str = "") -> Path:
    """Write `tensors` (moved to contiguous CPU memory) atomically (io.atomic_write_bytes), inside
    `root` if given (vidgen.paths.confine, checked at the moment of writing); returns the path.
    `path` may be a render's OutputSet, then the file is its `role` file (io.put_bytes: never over
    another render's file).

    An OSError becomes an OutputError `{failure}: {reason}`, and no partial file is left behind.
    Serialised in memory and written with open(), so the file gets the user's umask like the video
    next to it (safetensors' save_file creates files readable by the owner only).
    """
    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    data = serialise(tensors, metadata=metadata)
    if isinstance(path, OutputSet):
        return put_bytes(path, role, data, failure)
    return atomic_write_bytes(path, data, failure, root=root)


def read_safetensors(path: str | Path, fmt: str, what: str, not_ours: str, *, json_keys: tuple[str, ...] = ("config",),
                     fix: str = "give a file that vidgen wrote, or render again") -> tuple[dict, dict[str, str]]:
    """(tensors, metadata) of a vidgen safetensors file whose metadata `format` is `fmt`.

    The header is checked before any tensor is read, and each metadata entry in `json_keys` (every
    vidgen file keeps its resolved config as JSON in "config") must hold a JSON object, so a caller
    may json.loads them. A missing, unreadable or damaged file, or one of another format, is an
    InputError naming it as `what` (e.g. "checkpoint"); `not_ours` is the message for the wrong
    format and `fix` ends the message for a damaged one.
    """
    path = Path(path)
    meta = read_metadata(path, fmt, what, not_ours, json_keys, fix)
    try:
        with safe_open(str(path), framework="pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # safetensors has its own error types; the header was sound, so this is I/O
        raise InputError(f"cannot read {str(path)!r} as a {what} ({e.__class__.__name__}); {fix}") from None
    return tensors, meta


def read_metadata(path: Path, fmt: str, what: str, not_ours: str, json_keys: tuple[str, ...], fix: str) -> dict[str, str]:
    """The checked metadata of a vidgen safetensors file, reading its header only (see read_safetensors)."""
    if problem := path_problem(path, "file"):        # stat only: a FIFO or device is never opened
        raise InputError(f"{what} {str(path)!r} {problem}")
    if problem := check_safetensors(path):
        raise InputError(f"cannot read {str(path)!r} as a {what}: it {problem}; {fix}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except Exception as e:
        raise InputError(f"cannot read {str(path)!r} as a {what} ({e.__class__.__name__}); {fix}") from None
    if meta.get("format") != fmt:
        raise InputError(f"{str(path)!r} {not_ours}")
    problems: list[str] = []
    for key in json_keys:
        metadata_json(meta, key, problems)
    if problems:
        raise damaged(f"{what} {str(path)!r}", problems, fix)
    return meta


def save(path: Path | OutputSet, state: SamplerState, cfg: RenderConfig) -> Path:
    """Write the state atomically (temporary name, then rename); to a render's OutputSet, as its
    "resume" file. Returns the checkpoint's path."""
    tensors, meta = state.to_tensors()
    while True:     # the config names the output the checkpoint sits beside (a render's files may move once put)
        video = path.video if isinstance(path, OutputSet) else None
        here = cfg if video is None else _named(cfg, video)
        where = path.path("resume") if video is not None else path
        saved = write_safetensors(path, tensors, {"format": FORMAT, "state": json.dumps(meta),
                                                  "config": json.dumps(to_dict(here))},
                                  f"cannot write the checkpoint {where}", root=cfg.output.root, role="resume")
        if video is None or path.video == video:
            return saved


def _named(cfg: RenderConfig, video: Path) -> RenderConfig:
    """`cfg` with output.path naming `video` exactly (a resumed render writes there)."""
    return cfg if cfg.output.path == literal(str(video)) else replace(cfg, output=replace(cfg.output,
                                                                                       path=literal(str(video))))


def _read_checkpoint_meta(path: Path) -> dict[str, str]:
    return read_metadata(path, FORMAT, "checkpoint", "is not a vidgen checkpoint", ("config", "state"), FIX)


def load(path: str | Path, device=None) -> tuple[SamplerState, dict]:
    """(sampler state, the resolved config it was saved with, as a dict); InputError if damaged."""
    tensors, meta = read_safetensors(path, FORMAT, "checkpoint", "is not a vidgen checkpoint",
                                     json_keys=("config", "state"), fix=FIX)
    state = SamplerState.from_tensors(tensors, meta["state"], device=device, source=f"checkpoint {str(path)!r}",
                                      fix=FIX)
    return state, json.loads(meta["config"])


def _get(d: dict, key: str):
    for part in key.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d


def reconcile(cfg: RenderConfig, saved: dict, source: Path) -> dict:
    """Overrides that make `cfg` continue the saved render; refuse a checkpoint from other settings.

    The seed (when `cfg` leaves it random) and an output path with placeholders come from the
    checkpoint; every other identity setting must agree.
    """
    current = to_dict(cfg)
    fixed = {}
    if cfg.seed is None:
        fixed["seed"] = saved.get("seed")
    if has_placeholders(cfg.output.path):
        fixed["output.path"] = _get(saved, "output.path")
    diffs = [f"{k} is {_get(saved, k)!r} there, {fixed.get(k, _get(current, k))!r} here" for k in IDENTITY
             if fixed.get(k, _get(current, k)) != _get(saved, k)]
    diffs += _lora_diffs(cfg, saved)
    if diffs:
        raise ConfigError(f"checkpoint {source} was made with different settings ({'; '.join(diffs)}); "
                          f"resume with the same config, or start a new render", None)
    return fixed


def _lora_diffs(cfg: RenderConfig, saved: dict) -> list[str]:
    """A difference when the checkpoint was sampled with other LoRAs (by content, strength, expert)."""
    def ident(loras: list) -> list:
        return [(d.get("sha256"), float(d.get("strength", 1.0)), d.get("expert", "both")) for d in loras]

    here = []
    for lora in cfg.loras:
        path = Path(lora.path).expanduser()
        sha = lora.sha256 or (sha256_of(path) if path.is_file() else None)
        here.append({"sha256": sha, "strength": lora.strength, "expert": lora.expert})
    there = saved.get("loras") or []
    if ident(here) == ident(there if isinstance(there, list) else []):
        return []
    show = lambda ls: [f"{str(d.get('sha256'))[:12]} x{d.get('strength')} ({d.get('expert')})" for d in ls] or "none"  # noqa: E731
    return [f"loras are {show(there)} there, {show(here)} here"]


def resume_from(cfg: RenderConfig, source: str | Path) -> tuple[RenderConfig, SamplerState]:
    """(`cfg` made to continue the checkpoint at `source`, its sampler state); ConfigError if the
    checkpoint was made with other settings (see `reconcile`), InputError if it is damaged or its
    latents do not fit the render (the model folder says what shape they must have)."""
    state, saved = load(source)
    cfg = load_config(cfg, reconcile(cfg, saved, Path(source)))
    info = inspect(cfg.model)
    expected = (segment_latent_shape(cfg, info) if info.family.animate     # an Animate checkpoint: one segment's
                else info.latent_shape(cfg.width, cfg.height, cfg.num_frames))
    if tuple(state.latents.shape) != expected:
        raise damaged(f"checkpoint {str(source)!r}", [f"its latents have shape {list(state.latents.shape)}, but its "
                                                      f"settings need {list(expected)}"], FIX)
    return cfg, state


def find(cfg: RenderConfig) -> Path:
    """The checkpoint `--resume` without a path continues: this output's own checkpoint if the output
    path names one file, else the newest in the output folder whose settings match `cfg`.

    Damaged checkpoints are skipped with a warning each; InputError if none fits.
    """
    template = cfg.output.path
    folder_template = os.path.dirname(template)
    if has_placeholders(folder_template):
        raise InputError("output.path has placeholders in its folder; give the checkpoint: --resume PATH")
    if not has_placeholders(template):
        own = resume_path(output_path(template, seed=0, prompt=""))   # no placeholders: the arguments are unused
        if own.is_file():
            return own          # resume_from says what is wrong with it, if anything
    folder = Path(folder_template.format() or ".").expanduser()
    found = sorted(folder.glob("*.resume.safetensors"), key=_mtime, reverse=True) if folder.is_dir() else []
    if not found:
        raise InputError(f"no checkpoint (*.resume.safetensors) in {str(folder)!r} to resume; give one: --resume PATH")
    others = broken = 0
    for path in found:
        try:
            reconcile(cfg, json.loads(_read_checkpoint_meta(path)["config"]), path)   # header only: cheap
            load(path)                                                                  # then the tensors
        except ConfigError:
            others += 1
            continue
        except InputError as e:
            log.warning("skipping a damaged checkpoint: %s", e)
            broken += 1
            continue
        return path
    why = ", ".join(f"{n} {reason}" for n, reason in ((others, "made with other settings"), (broken, "damaged")) if n)
    raise InputError(f"none of the {len(found)} checkpoints in {str(folder)!r} continues this render ({why}); "
                     f"give one: --resume PATH, or start the render without --resume")


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


# ------------------------------------------------------------------------ where a render starts
# What a render continues from, and what becomes of a checkpoint that cannot continue it:
# - `--resume PATH`, and the output's own checkpoint that `--resume` finds: refused with what is wrong
#   (a user named it, or it is this output's);
# - `--resume` searching the output folder (`find`): a damaged one is skipped with a warning, one made
#   with other settings silently, and the newest that fits continues;
# - a queue job's own checkpoint (`start_job`): one that is damaged or made with other settings is set
#   aside (renamed NAME.damaged-TIME, logged) and the job starts from step 0, for no one is there to fix it.


@dataclass(frozen=True)
class Start:
    """Where a render starts: its config (a continued render's seed and output path from the
    checkpoint), the sampler state to continue (None: step 0), the files at its output's names that
    are its own (preflight's `own`: not in the way), and whether an earlier attempt of the same queue
    job already finished the video (then there is nothing to render)."""

    config: RenderConfig
    state: SamplerState | None = None
    own: tuple[Path, ...] = ()
    finished: bool = False


def start_render(cfg: RenderConfig, source: bool | str | Path | None) -> Start:
    """Where a render asked to `--resume` starts: from the checkpoint at `source`, or with True from
    the one `find` picks; with no `source`, from step 0. ConfigError or InputError when it cannot
    continue (see resume_from)."""
    if not source:
        return Start(cfg)
    path = find(cfg) if source is True else Path(source).expanduser()
    cfg, state = resume_from(cfg, path)
    log.info("resuming %s at step %d of %d", path, state.step, state.steps)
    return Start(cfg, state, (Path(path).absolute(),))


def start_job(cfg: RenderConfig, out: Path, job: dict) -> Start:
    """Where an attempt of the queue job `job` (its identity: id, created, config digest, as its
    sidecar and latents record it) rendering `cfg` to `out` starts, from what earlier attempts left
    at the output's names:

    - the finished video, its sidecar naming this job: kept, finished (at-least-once delivery: the
      writer renames only a complete file into place, so it is whole);
    - the sidecar alone (renamed just before the worker died): removed, the video will follow it again;
    - latents naming this job: its own, written over;
    - the checkpoint: continued; one damaged or made with other settings is set aside (see above).

    Anything else there is someone else's, and preflight refuses it unless output.overwrite is set.
    """
    side = sidecar_path(out)
    try:
        mine = json.loads(side.read_text()).get("job") == job
    except (OSError, ValueError, AttributeError):
        mine = False
    if mine and out.exists():
        return Start(cfg, finished=True)
    if mine:
        side.unlink()
    latents = latents_path(out)
    try:        # the header only; "job" must be there, as JSON
        meta = read_metadata(latents, LATENTS_FORMAT, "vidgen latents file", "is not vidgen's", ("job",), "")
        own = (latents,) if json.loads(meta["job"]) == job else ()
    except InputError:      # missing, damaged or another's: preflight decides
        own = ()
    path = resume_path(out)
    if not path.exists():
        return Start(cfg, own=own)
    try:
        cfg, state = resume_from(cfg, path)
    except (InputError, ConfigError) as e:
        aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
        path.rename(aside)
        log.warning("job #%d: set the checkpoint aside as %s and started from step 0: %s", job["id"], aside.name, e)
        return Start(cfg, own=own)
    log.info("resuming job #%d at step %d of %d", job["id"], state.step, state.steps)
    return Start(cfg, state, own + (path,))


# ------------------------------------------------------------------------------------ the latents file

LATENTS_FORMAT = "vidgen-latents-1"
SPACE = "model"
"""What a latents file's `space` metadata says: its latents are model-space, normalised with the VAE's
latents_mean/std as the transformer samples them (every vidgen-latents-1 file is, tagged or not);
vidgen.vae.denormalize turns them into what the VAE decodes."""


def save_latents(path: Path | OutputSet, latents, cfg: RenderConfig, variant: str, job: dict | None) -> Path:
    """Write a render's sampled latents with its resolved config (and the queue job that made it);
    to a render's OutputSet, as its "latents" file. Returns the file's path."""
    meta = {"format": LATENTS_FORMAT, "vidgen_version": __version__, "config": json.dumps(to_dict(cfg)),
            "variant": variant, "space": SPACE}
    if job is not None:
        meta["job"] = json.dumps(job, sort_keys=True)
    where = path.path("latents") if isinstance(path, OutputSet) else path
    return write_safetensors(path, {"latents": latents.float()}, meta, f"cannot write latents to {where}",
                             root=cfg.output.root, role="latents")


def read_latents(path: str | Path):
    """Load a latents file written by a render: (latents [1, z, T, h, w], its config as a dict)."""
    tensors, meta = read_safetensors(path, LATENTS_FORMAT, "vidgen latents file",
                                     f"is not a vidgen latents file (no '{LATENTS_FORMAT}' metadata)")
    if "latents" not in tensors:
        raise InputError(f"cannot read {str(path)!r} as a vidgen latents file (no 'latents' tensor)")
    if meta.get("space", SPACE) != SPACE:
        raise InputError(f"{str(path)!r} says its latents are in {safe_name(meta['space'], 'an unknown')} space; "
                         f"vidgen reads {SPACE}-space latents files only, as it writes them: give a file that vidgen wrote")
    return tensors["latents"], json.loads(meta["config"])
