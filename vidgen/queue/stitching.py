"""A workflow's stitch step: its keys (StitchStep), the checks made when the workflow loads, and the
stitch job it plans (vidgen.queue.steps runs it).

    steps:
      stitch:
        output: film.mp4
        crossfade: 0.25                                   # seconds, rounded to whole frames (noted)
        audio: {path: music/score.wav, offset: 0.0, fit: both}
        timeline: [otio, edl, fcpxml]

Everything a stitch would refuse is refused here, before any shot renders: a track that is missing,
holds no sound, plays none of itself, or whose length `fit` refuses for the film's length (known
from the shots' frames, the joins and the crossfade: steps.layout); a film container without sound
(.gif, PNG frames); an unknown timeline format or one whose package is not installed; a timeline file
that would replace one without `overwrite: true`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING

from .. import sound
from ..config import CODECS, AudioConfig, ProvenanceConfig
from ..errors import OutputError
from ..io import check_output, codec_for_path, encoder_problem
from ..paths import check_targets
from . import edits, timeline
from .ledger import JobSpec
from .film import film_frames, layout
from .steps import WORKFLOW_OVERWRITE, StitchJob

Workflow = Any
"""vidgen.queue.workflow.Workflow, which imports this module: named here only for the annotations."""


@dataclass
class StitchStep:
    output: str = MISSING
    """Video file name under output_dir, e.g. demo.mp4 (sub-folders allowed; no absolute path, no '..')."""
    crossfade: float = 0.0
    """Seconds over which one shot blends into the next (rounded to whole frames); 0 = hard cuts."""
    audio: AudioConfig = field(default_factory=AudioConfig)
    """{path, offset, fit}: sound under the film, the keys a render's `audio:` has (vidgen.sound); a
    relative path starts at the current directory, like every input of a workflow."""
    timeline: list[str] = field(default_factory=list)
    """Editorial timelines written beside the film: otio, edl, fcpxml (vidgen.queue.timeline)."""
    codec: str = "auto"
    """The film's codec, as a render's output.codec: auto (by extension) or e.g. prores, dnxhr for a master
    (the shots' frames are then read at 16 bits: a master's depth is kept through the stitch)."""
    profile: Optional[str] = None
    """prores / dnxhr profile, as a render's output.profile."""
    provenance: ProvenanceConfig = field(default_factory=ProvenanceConfig)
    """{key, cert}: sign the film's C2PA content credentials, each shot an ingredient (with its own
    credentials when it has them). The watermark is a shot's setting: its frames carry it into the film."""

    def problems(self) -> list[str]:
        out = [f"steps.stitch.{p}" for p in self.audio.problems() + self.provenance.problems()]
        if self.codec not in ("auto", *CODECS):
            out.append(f"steps.stitch.codec: {self.codec!r} is unknown; allowed: auto, {', '.join(CODECS)}")
        if self.provenance.watermark:
            out.append("steps.stitch.provenance.watermark: the stitch does not mark frames; set provenance.watermark "
                       "in the shots' config (their frames carry the mark into the film)")
        return out + ([f"steps.stitch.crossfade: {self.crossfade} must be >= 0 seconds (0 = hard cuts)"]
                      if self.crossfade < 0 else [])


def film_inputs(wf: Workflow) -> tuple[list[int], list[int], list[int]]:
    """The stitch's inputs: (the entries of wf.shots shown, in order; frames each drops, shared with the
    one before; frames each blends with it instead, continuity.fuse: linear)."""
    shown = edits.film(wf.shots)    # a repaint in its source's place
    fused = [wf.shots[i].joins and wf.shots[i].continuity.get("fuse") == "linear" for i, _ in shown]
    joins = [0 if f else drop for f, (_, drop) in zip(fused, shown)]
    blends = [drop if f else 0 for f, (_, drop) in zip(fused, shown)]
    return [i for i, _ in shown], joins, blends


def check_stitch(wf: Workflow, problems: list[str], notes: list[str]) -> None:
    """Every problem with the workflow's stitch step (appended to `problems`), what was rounded to `notes`."""
    stitch, where = wf.stitch, "steps.stitch"      # its output's place is checked by the workflow (_confine)
    try:
        codec = codec_for_path(stitch.output) if stitch.codec == "auto" else stitch.codec
    except OutputError as e:
        codec = None
        problems.append(f"{where}.output: {e}")
    if not wf.shots:
        return
    if codec in CODECS:
        first = wf.shots[0].config
        found = check_output(stitch.output, codec, _pix_fmt(stitch, codec, first.output.pix_fmt), first.width,
                             first.height, profile=stitch.profile, fps=first.fps) or [encoder_problem(codec)]
        problems += [f"{where}: {p}" for p in found if p]
    if stitch.provenance.signs:
        from .. import provenance

        film = wf.output_dir / stitch.output
        if why := provenance.supports(film):
            problems.append(f"{where}.provenance: {why}")
        problems += [f"{where}.provenance: {p}" for p in provenance.check_credentials(stitch.provenance.key,
                                                                                       stitch.provenance.cert)]
        if sidecar := provenance.c2pa_sidecar(film):
            problems += check_targets([(f"{where}.provenance (the film's credentials)", sidecar)],
                                      overwrite=wf.overwrite, root=wf.output_dir, overwrite_hint=WORKFLOW_OVERWRITE)
    if os.path.abspath(wf.output_dir / stitch.output) in {s.config.output.path for s in wf.shots}:
        problems.append(f"{where}.output: {stitch.output!r} is a shot's own output; choose another name")
    first = wf.shots[0].config
    formats = {(s.config.width, s.config.height, s.config.fps) for s in wf.shots}
    if len(formats) > 1:
        listing = ", ".join(f"{s.name} {s.config.width}x{s.config.height}@{s.config.fps}" for s in wf.shots)
        problems.append(f"{where}: every shot must have the same size and fps to be stitched; got {listing}")
    fps = first.fps
    k = round(stitch.crossfade * fps)
    if stitch.crossfade < 0:
        return  # reported by StitchStep.problems
    if stitch.crossfade > 0 and k == 0:
        problems.append(f"{where}.crossfade: {stitch.crossfade} s is less than one frame at {fps} fps; "
                        f"use 0 or at least {1 / fps:g}")
    elif k != stitch.crossfade * fps:
        notes.append(f"{where}.crossfade: {stitch.crossfade:g} s at {fps} fps is {k} frames ({k / fps:g} s)")
    shown = edits.film(wf.shots)    # inner shots fade in and out; windows and extensions join, unfaded
    short = False
    for p, (i, drop) in enumerate(shown):
        shot = wf.shots[i]
        need = k * ((p > 0 and not drop) + (p < len(shown) - 1 and not shown[p + 1][1])) + drop
        if need > shot.config.num_frames:
            short = True
            problems.append(f"{where}.crossfade: {stitch.crossfade:g} s ({k} frames at {fps} fps) is longer than "
                            f"shot {shot.name!r} allows: it has {shot.config.num_frames} frames and needs {need} "
                            "(a crossfade at each end of an inner shot)")
    order, joins, blends = film_inputs(wf)
    seconds = None if short or len(formats) > 1 else \
        film_frames(layout([wf.shots[i].config.num_frames for i in order], joins, blends, k)) / fps
    _check_extras(wf, stitch, fps, seconds, problems)


def _check_extras(wf: Workflow, stitch: StitchStep, fps: int, seconds: Optional[float], problems: list[str]) -> None:
    """The sound and the timeline: the track against the film's length, the formats, their files."""
    where = "steps.stitch"
    if stitch.audio.path is not None and stitch.audio.fit in sound.FITS:     # else StitchStep.problems says why
        ext = os.path.splitext(stitch.output)[1]
        problems += [f"{where}.audio: {p}" for p in sound.check(stitch.audio.path, stitch.audio.offset,
                                                                  stitch.audio.fit, seconds, ext, fps=fps)]
    if stitch.timeline:
        found = timeline.problems(stitch.timeline, fps)
        problems += [f"{where}.timeline: {p}" for p in found]
        if not found and not any(p.startswith(f"{where}.output") for p in problems):
            film = wf.output_dir / stitch.output
            problems += check_targets([(f"{where}.timeline ({fmt})", path) for fmt, path in
                                       timeline.paths(film, stitch.timeline).items()],
                                      overwrite=wf.overwrite, root=wf.output_dir, overwrite_hint=WORKFLOW_OVERWRITE)


def stitch_job(wf: Workflow, deps: list[int]) -> JobSpec:
    """The stitch job: the shots shown, in order, with their joins, blends and names; the sound and
    timeline as the step says; it runs after the jobs `deps`."""
    first, step = wf.shots[0].config, wf.stitch
    order, joins, blends = film_inputs(wf)
    audio = dataclasses.asdict(step.audio) if step.audio.path is not None else None
    codec = step.codec if step.codec != "auto" else codec_for_path(step.output)
    signs = {"key": step.provenance.key, "cert": step.provenance.cert} if step.provenance.signs else None
    job = StitchJob([wf.shots[i].config.output.path for i in order], str(wf.output_dir / step.output), first.fps,
                    step.crossfade, first.output.crf, _pix_fmt(step, codec, first.output.pix_fmt), wf.overwrite,
                    str(wf.output_dir), joins if any(joins) else None, blends if any(blends) else None, audio,
                    list(step.timeline) or None, [wf.shots[i].name for i in order], step.codec, step.profile, signs)
    return JobSpec(kind="stitch", payload=dataclasses.asdict(job), name=f"{wf.name}/stitch", deps=deps,
                   output=job.output, group=wf.name)


def _pix_fmt(step: StitchStep, codec: str, shots: str) -> str:
    """The film's pix_fmt: the shots' where the film's codec takes it (h264, h265, vp9), else auto."""
    spec = CODECS[codec]
    return shots if shots in spec.pix_fmts and not spec.profiles else "auto"
