"""Stage 6 of a render, delivery: decoded frames -> kept pixels, colour, guard -> watermark -> retime ->
the writer (codec, master depth, timecode) -> sound muxed and credentials signed -> in place.

Frames stay 16-bit from the decoder to the encoder when the output keeps more than 8 bits (a master,
vidgen.masters); the guard, the kept PNG frames and the previews see them rounded to 8 bits. The
sound and the signature are made on the finished temporary file, before the one rename into place
(VideoWriter's `finish`): a failure in either leaves nothing at the output path.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from . import __version__, guard, lora
from .config import RenderConfig, digest, to_dict
from .continuity import colour_match, save_kept_frames
from .control import composite
from .io import VideoWriter, kept_metadata, put_bytes
from .masters import to_deep, to_eight
from .paths import OutputSet, discard, ensure_folder, partial_path
from .preview import reduce, review_frames
from .retime import retime, retimed_count
from .vae import decode_frames

log = logging.getLogger("vidgen")


def decode_and_write(vae, latents: torch.Tensor | None, plan, callback: Callable, timings: dict[str, float],
                     outputs: OutputSet, progress: Callable, frames: list | None = None) -> tuple[int, dict | None]:
    """Decode model-space latents and stream the frames through the guard into the writer (`frames`: the
    frames already decoded, uint8 or with output.deep uint16 [H, W, 3] host tensors, taken one by one
    instead: an Animate render's segments).

    Returns (frames written, the guard's report or None); `timings` gains decode_write. The sidecar is
    written by the writer before it renames the video into place, both through `outputs` (so they land
    beside the render's latents). A clip the guard blocks, or a guard error, raises inside the writer,
    which then deletes its partial file: nothing reaches the output path. `progress(stage, i, n,
    preview)` makes the pipeline's Progress report.
    """
    cfg = plan.config
    deep, fps = cfg.output.deep, cfg.output.fps or cfg.fps
    meta = {"title": cfg.prompt[:250],
            "comment": json.dumps({"prompt": cfg.prompt, "negative_prompt": cfg.negative_prompt, "seed": plan.seed,
                                   "config_digest": digest(cfg), "vidgen": __version__,
                                   **({"loras": lora.records(plan.loras)} if plan.loras else {})})}
    total = cfg.num_frames
    t0 = time.perf_counter()
    callback(progress("decode", 0, total, None))
    device = next(vae.parameters()).device
    checks = guard.frame_guard(cfg.guard, fps=cfg.fps, width=cfg.width, height=cfg.height, device=device,
                               classifier=plan.classifier)
    report = None

    def sidecar() -> dict:
        timings["decode_write"] = time.perf_counter() - t0
        return render_sidecar(plan, writer.frames_written, timings, report)

    ensure_folder(plan.output, cfg.output.root)
    match, keep, kept = colour_match(plan.colour_reference), {k % total for k in cfg.output.keep_frames}, {}
    mark, manifest = _watermark(cfg), []
    deep_held: deque[tuple[torch.Tensor, torch.Tensor]] = deque()    # (8-bit copy the guard sees, 16-bit frame)
    rendered = [0]

    def delivered(ready: torch.Tensor) -> np.ndarray:
        """A frame the guard released -> the frame to write (16-bit kept unless the guard pixelated it: the
        guard hands back the very tensor it was given, or a new one when it pixelated the frame)."""
        full = ready
        if deep:
            eight, full = deep_held.popleft()
            if ready is not eight:
                full = torch.from_numpy(to_deep(ready.numpy()))
        if rendered[0] in keep:
            kept[rendered[0]] = to_eight(full.numpy())
        rendered[0] += 1
        return mark(full.numpy()) if mark else full.numpy()

    def stream():
        source = (_taken(frames) if frames is not None else
                  review_frames(vae, latents, total, cfg.height, cfg.width) if cfg.output.decode == "preview" else
                  decode_frames(vae, latents, space="model", kernels=plan.target.kernels, plan=plan.decode, deep=deep))
        for i, frame in enumerate(source, 1):
            frame = composite(plan.control, i - 1, match(frame) if match else frame)     # kept pixels as given
            eight = _eight(frame)
            if deep:
                deep_held.append((eight, frame))
            for ready in (checks.push(eight) if checks else [eight]):
                yield delivered(ready)
            callback(progress("decode", i, total, None if checks else lambda f=eight: reduce(f.numpy())))
        if checks:
            rest, found = checks.finish()
            for ready in rest:
                yield delivered(ready)
            log.info("guard: %s", found.summary())
            guard.enforce(found)
            nonlocal report
            report = found.to_dict()

    with VideoWriter(outputs.path("video"), fps=fps, width=cfg.width, height=cfg.height, codec=plan.codec,
                     crf=cfg.output.crf, pix_fmt=cfg.output.pix_fmt, profile=cfg.output.profile, exr=cfg.output.exr,
                     timecode=cfg.output.timecode, metadata=kept_metadata(plan.output, meta), sidecar=sidecar,
                     outputs=outputs, finish=finisher(plan, lambda: report, manifest)) as writer:
        for frame in retime(stream(), total, cfg.fps, fps, cfg.output.retime.method):
            writer.write(frame)
    if manifest and manifest[0] is not None:        # the credentials of a .mkv/.webm/.mxf: NAME.c2pa beside it
        put_bytes(outputs, "c2pa", manifest[0], f"cannot write the content credentials of {outputs.video}")
    save_kept_frames(outputs.video, kept, overwrite=cfg.output.overwrite, root=cfg.output.root)
    return writer.frames_written, report


def _taken(frames: list):
    """The frames of `frames`, each let go of as it is yielded (the list empties as the writer goes)."""
    frames.reverse()
    while frames:
        yield frames.pop()


def _eight(frame: torch.Tensor) -> torch.Tensor:
    return frame if frame.dtype == torch.uint8 else torch.from_numpy(to_eight(frame.numpy()))


def _watermark(cfg: RenderConfig) -> Callable[[np.ndarray], np.ndarray] | None:
    """provenance.watermark: each frame marked (vidgen.watermark; a master's 16-bit frames at full depth)."""
    if not cfg.provenance.watermark:
        return None
    from . import watermark

    return watermark.embed


def finisher(plan, report: Callable[[], dict | None], manifest: list) -> Callable[[Path], Path] | None:
    """What is done to the finished file before it is put in place: the sound muxed (audio.path), then
    the C2PA manifest signed (provenance.key/cert; `manifest` gets the sidecar manifest's bytes for
    .mkv/.webm/.mxf, None when embedded). None when neither is asked."""
    cfg = plan.config
    if not cfg.audio.path and not cfg.provenance.signs:
        return None

    def finish(video: Path) -> Path:
        done = video
        if cfg.audio.path:
            from . import sound

            muxed = partial_path(video.with_name(video.name + ".sound" + video.suffix))
            # mux and sign leave nothing at their destination when they fail; the writer deletes `video`
            sound.mux(done, muxed, track=Path(cfg.audio.path), offset=cfg.audio.offset, fit=cfg.audio.fit)
            done = muxed
        if cfg.provenance.signs:
            from . import provenance

            signed = partial_path(video.with_name(video.name + ".signed" + video.suffix))
            try:
                manifest[:] = [provenance.sign(done, signed, key=cfg.provenance.key, cert=cfg.provenance.cert,
                                               claims=claims(plan, report()), title=plan.output.name)]
            finally:
                if done != video:
                    discard(done)
            done = signed
        return done
    return finish


def claims(plan, report: dict | None) -> dict[str, Any]:
    """What the content credentials say generated the file (provenance.sign's claims); `report`: the
    guard's (None: the guard did not run)."""
    from . import provenance

    cfg = plan.config
    model = {}
    for part in (cfg.model.path, cfg.model.transformer, cfg.model.transformer_2, cfg.model.vae):
        if part and Path(part).exists():
            model.update(provenance.model_digests(part))
    return {"vidgen": __version__, "variant": plan.info.variant, "model": model,
            "loras": lora.records(plan.loras) if plan.loras else [], "config_digest": digest(cfg),
            "seed": plan.seed, "guard": _verdict(report), **({"watermark": _mark_claim()} if cfg.provenance.watermark else {}),
            "prompt": cfg.prompt}


def _mark_claim() -> dict:
    from . import watermark

    return watermark.CLAIM


def _verdict(report: dict | None) -> dict | None:
    """The guard's verdict for the credentials: what ran and what it found, without per-frame scores."""
    if report is None:
        return None
    return {k: v for k, v in report.items() if not isinstance(v, (list, dict)) or k == "checks"}


def render_sidecar(plan, frames: int, timings: dict, report: dict | None) -> dict:
    """The render's JSON sidecar (<output>.json): what made it, how long it took, the whole config."""
    cfg = plan.config
    sidecar = {"prompt": cfg.prompt, "negative_prompt": cfg.negative_prompt, "seed": plan.seed,
               "config_digest": digest(cfg), "variant": plan.info.variant,
               "num_frames": frames, "fps": cfg.output.fps or cfg.fps, "size": [cfg.width, cfg.height],
               "timings": timings, "vidgen": __version__, "config": to_dict(cfg)}
    if cfg.output.fps and cfg.output.fps != cfg.fps:
        sidecar["rendered"] = {"num_frames": cfg.num_frames, "fps": cfg.fps, "retime": cfg.output.retime.method,
                               "delivered_frames": retimed_count(cfg.num_frames, cfg.fps, cfg.output.fps)}
    extra = {"loras": lora.records(plan.loras) if plan.loras else None, "job": plan.job, "guard": report,
             "memory_plan": plan.memory.to_json()}
    return {**sidecar, **{k: v for k, v in extra.items() if v is not None}}
