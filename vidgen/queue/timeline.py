"""A stitched film's editorial timeline (OpenTimelineIO): one clip per shot, as the stitch cut it.

Each clip references its shot's master (the file the stitch read: for a reviewed shot the approved
take's full decode) and its source range is what the stitch used of it. Frames a join drops (a long
take's shared window frames, an extension's kept frames) are outside the range; a crossfade (or a
`continuity.fuse: linear` blend) of k frames is a dissolve Transition centred on the cut, its
halves the handles beyond the two ranges. So the video track lasts exactly the film's frames, at
rate = fps. A marker on each incoming clip marks the cut (the dissolve's centre). Each clip carries
its shot's prompt, seed and config digest under metadata["vidgen"], read from the shot's sidecar
(`<video>.json`). A stitch with sound adds an audio track: the track file at its offset, with gaps
for silence.

Formats (steps.stitch.timeline), each written beside the film, atomically:
    otio    <film>.otio  OpenTimelineIO JSON: everything above
    edl     <film>.edl   CMX 3600 (package otio-cmx3600-adapter): the video track only, dissolves
                         as D events, clip names and markers as comments; no metadata, no sound
    fcpxml  <film>.xml   Final Cut Pro 7 XML / xmeml (package otio-fcp-adapter; Premiere, Resolve):
                         both tracks, dissolves, markers; prompt, seed and digest as logging info
SMPTE timecode has no 8 or 16 fps, so EDL and FCP XML count time at the smallest timecode rate that
is a whole multiple of the fps (8 -> 24, 16 -> 48): every frame keeps its exact time; audio offsets
round to that rate's frames. opentimelineio is imported only when a timeline is asked for.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from ..errors import ConfigError, InputError, MissingExtra, OutputError, install_hint
from ..io import atomic_write_bytes
from ..paths import sidecar_path
from .film import Piece

if TYPE_CHECKING:
    from ..sound import SoundReport

log = logging.getLogger("vidgen")

# format -> (file extension, OTIO adapter, the package that ships the adapter)
FORMATS: dict[str, tuple[str, str, str]] = {
    "otio": (".otio", "otio_json", "opentimelineio"),
    "edl": (".edl", "cmx_3600", "otio-cmx3600-adapter"),
    "fcpxml": (".xml", "fcp_xml", "otio-fcp-adapter"),
}
TIMECODE_RATES = (24, 25, 30, 48, 50, 60)
"""The integer frame rates SMPTE timecode counts (EDL and FCP XML need one)."""
EXTRA = "timeline"
"""vidgen's extra that installs opentimelineio and the adapters."""


def paths(film: str | Path, formats: list[str]) -> dict[str, Path]:
    """Where each format's file goes: beside the film, its stem and the format's extension."""
    film = Path(film)
    return {f: film.with_suffix(FORMATS[f][0]) for f in formats if f in FORMATS}


def timecode_rate(fps: int) -> Optional[int]:
    """The smallest SMPTE timecode rate that is a whole multiple of `fps` (None: there is none)."""
    return next((r for r in TIMECODE_RATES if r % fps == 0), None) if fps > 0 else None


def installed_adapters() -> set[str]:
    """The OTIO adapters this environment has (empty when opentimelineio itself is not installed)."""
    if importlib.util.find_spec("opentimelineio") is None:
        return set()
    import opentimelineio as otio

    return set(otio.adapters.available_adapter_names())


def problems(formats: Any, fps: int) -> list[str]:
    """Every problem with writing `formats` for a film at `fps`, as sentences ([] if none): an unknown
    or repeated format, a package not installed (named, with how to install it), an fps no timecode
    rate is a multiple of (EDL, FCP XML)."""
    if not isinstance(formats, list) or not all(isinstance(f, str) for f in formats):
        return [f"{formats!r} is not a list of formats; e.g. [otio, edl, fcpxml]"]
    out = [f"{f!r} is not a timeline format; choose from {', '.join(FORMATS)}" for f in formats if f not in FORMATS]
    out += [f"{f!r} is listed twice" for f in sorted({f for f in formats if formats.count(f) > 1})]
    known = [f for f in dict.fromkeys(formats) if f in FORMATS]
    if known:
        have = installed_adapters()
        out += [_missing(f) for f in known if FORMATS[f][1] not in have]
    for f in known:
        if f != "otio" and timecode_rate(fps) is None:
            out.append(f"{f} needs timecode, which counts {', '.join(map(str, TIMECODE_RATES))} fps; {fps} fps divides "
                       "none of them: use otio, or an fps such as 8, 12, 16, 24")
    return out


def _missing(fmt: str) -> str:
    package = FORMATS[fmt][2]
    return (f"{fmt} needs the package {package}, which is not installed: pip install {package} (vidgen's "
            f"'{EXTRA}' extra has it: {install_hint(EXTRA)})")


def require(formats: list[str], fps: int) -> None:
    """Raise (before any work) unless every format can be written: MissingExtra when a package is not
    installed (a queue worker then gives the job back), ConfigError otherwise."""
    if found := [f"stitch timeline: {p}" for p in problems(formats, fps)]:
        missing = [p for p in found if "not installed" in p]
        raise MissingExtra(missing) if missing else ConfigError(found)


def shot_records(inputs: list[str]) -> list[dict]:
    """Each input's sidecar (`<video>.json`), read now: the prompt, seed and config digest its clip carries.

    Raises:
        InputError: a sidecar is missing or is not a JSON object.
    """
    records = []
    for path in inputs:
        side = sidecar_path(Path(path))
        try:
            data = json.loads(side.read_text())
        except FileNotFoundError:
            raise InputError(f"stitch timeline: {side} does not exist; a shot's clip takes its prompt, seed and config "
                             "digest from the sidecar its render wrote beside it") from None
        except (OSError, ValueError) as e:
            raise InputError(f"stitch timeline: cannot read {side}: {e}") from None
        if not isinstance(data, dict):
            raise InputError(f"stitch timeline: {side} is not a JSON object")
        records.append(data)
    return records


def _clip_metadata(name: str, path: str, record: dict, used: tuple[int, int]) -> dict:
    review = (record.get("job") or {}).get("review") if isinstance(record.get("job"), dict) else None
    meta = {"shot": name, "master": path, "prompt": record.get("prompt"), "seed": record.get("seed"),
            "config_digest": record.get("config_digest"), "frames_used": list(used)}
    if isinstance(review, dict) and "take" in review:
        meta["take"] = review["take"]
    return meta


def build(film: Path, fps: int, inputs: list[str], names: list[str], records: list[dict], pieces: list[Piece],
          kinds: list[str], sound: Optional[SoundReport] = None):
    """The film's timeline (an opentimelineio Timeline): a video track of one clip per input, cut
    where the stitch cut (`pieces`: steps.layout), dissolves for its blends (`kinds`: per input, how
    it joins the one before: "cut", "join", "crossfade" or "fuse"), and an audio track for `sound`."""
    import opentimelineio as otio

    rt, span = otio.opentime.RationalTime, otio.opentime.TimeRange
    frames = lambda n: rt(n, fps)     # noqa: E731
    timeline = otio.schema.Timeline(name=film.stem, global_start_time=frames(0))
    video = otio.schema.Track(name="V1", kind=otio.schema.TrackKind.Video)
    timeline.tracks.append(video)
    for n, (path, name, record, piece) in enumerate(zip(inputs, names, records, pieces)):
        half_in, half_out = piece.fade_in // 2, piece.fade_out // 2     # the cut: each dissolve's centre
        first, end = piece.skip + half_in, piece.frames - piece.fade_out + half_out
        if piece.fade_in:
            video.append(otio.schema.Transition(
                name=kinds[n], transition_type=otio.schema.TransitionTypes.SMPTE_Dissolve,
                in_offset=frames(half_in), out_offset=frames(piece.fade_in - half_in)))
        clip = otio.schema.Clip(name=name, media_reference=_reference(path, piece.frames, fps),
                                source_range=span(frames(first), frames(end - first)))
        clip.metadata["vidgen"] = _clip_metadata(name, path, record, (piece.skip, piece.frames))
        if n:
            dropped = f", its first {piece.skip} frames shown by {names[n - 1]}" if piece.skip else ""
            blended = f", {piece.fade_in}-frame {kinds[n]}" if piece.fade_in else ""
            clip.markers.append(otio.schema.Marker(
                name=f"cut {n}: {names[n - 1]} | {name}{blended}{dropped}", marked_range=span(frames(first), frames(0)),
                color=otio.schema.MarkerColor.RED,
                metadata={"vidgen": {"film_frame": piece.start + half_in, "kind": kinds[n]}}))
        video.append(clip)
    timeline.metadata["vidgen"] = {"film": str(film), "fps": fps, "frames": round(video.duration().value)}
    if sound is not None:
        timeline.tracks.append(_sound_track(otio, sound))
    return timeline


def _reference(path: str, count: int, fps: int):
    """A shot's master: its video file, or its folder of PNG frames as an image sequence."""
    import opentimelineio as otio

    available = otio.opentime.TimeRange(otio.opentime.RationalTime(0, fps), otio.opentime.RationalTime(count, fps))
    folder = Path(path)
    if folder.is_dir():
        ref = otio.schema.ImageSequenceReference(
            target_url_base=folder.absolute().as_uri() + "/", name_prefix="frame_", name_suffix=".png",
            start_frame=0, frame_zero_padding=5, rate=fps, available_range=available)
    else:
        ref = otio.schema.ExternalReference(target_url=folder.absolute().as_uri(), available_range=available)
    ref.name = folder.name
    return ref


def _sound_track(otio, sound: SoundReport):
    """The film's sound, sample-exact: silence (a Gap) before the track, the track from its `skip`
    sample, silence after its end."""
    rt, span = otio.opentime.RationalTime, otio.opentime.TimeRange
    rate = sound.sample_rate
    samples = lambda n: rt(n, rate)     # noqa: E731
    track = otio.schema.Track(name="A1", kind=otio.schema.TrackKind.Audio)
    heard = sound.samples - min(sound.lead, sound.samples) - sound.padded
    if sound.lead:
        track.append(otio.schema.Gap(source_range=span(samples(0), samples(min(sound.lead, sound.samples)))))
    if heard > 0:
        ref = otio.schema.ExternalReference(
            target_url=Path(sound.track).absolute().as_uri(),
            available_range=span(samples(0), samples(sound.skip + heard + sound.cut)))
        clip = otio.schema.Clip(name=Path(sound.track).name, media_reference=ref,
                                source_range=span(samples(sound.skip), samples(heard)))
        clip.metadata["vidgen"] = {"offset": sound.offset, "fit": sound.fit, "padded_samples": sound.padded,
                                   "cut_samples": sound.cut, "codec": sound.codec}
        track.append(clip)
    if sound.padded:
        track.append(otio.schema.Gap(source_range=span(samples(0), samples(sound.padded))))
    return track


def _at_rate(timeline, rate: int):
    """A copy of `timeline` with every time counted in frames of `rate`, whole numbers (EDL and FCP
    XML write timecode and integer frames; the video's times are exact, the sound's rounded), a
    folder of PNG frames referenced as the folder, and each clip's vidgen metadata as FCP logging info."""
    import opentimelineio as otio

    copy = timeline.deepcopy()
    rt, span = otio.opentime.RationalTime, otio.opentime.TimeRange

    def at(t):
        return rt(round(t.rescaled_to(rate).value), rate)

    def spanned(r):
        return span(at(r.start_time), at(r.duration))
    copy.global_start_time = at(copy.global_start_time)
    for item in copy.find_children():
        if isinstance(item, otio.schema.Transition):
            item.in_offset, item.out_offset = at(item.in_offset), at(item.out_offset)
            continue
        if item.source_range is not None:
            item.source_range = spanned(item.source_range)
        for marker in item.markers:
            marker.marked_range = spanned(marker.marked_range)
        ref = getattr(item, "media_reference", None)
        if isinstance(ref, otio.schema.ImageSequenceReference):     # neither writer takes one: its folder
            folder = otio.schema.ExternalReference(target_url=ref.target_url_base.rstrip("/"),
                                                   available_range=ref.available_range)
            folder.name, item.media_reference = ref.name, folder
            ref = folder
        if ref is not None and ref.available_range is not None:
            ref.available_range = spanned(ref.available_range)
        if isinstance(item, otio.schema.Clip) and "vidgen" in item.metadata:
            item.metadata["fcp_xml"] = _logging_info(dict(item.metadata["vidgen"]))
    return copy


def _logging_info(meta: dict) -> dict:
    """What FCP XML keeps of a clip's vidgen metadata: its logging info (shown by editors)."""
    if "prompt" not in meta:
        return {}
    return {"logginginfo": {"description": str(meta.get("prompt")), "scene": str(meta.get("shot")),
                            "lognote": f"seed {meta.get('seed')}; config {meta.get('config_digest')}"
                                       + (f"; take {meta['take']}" if "take" in meta else "")}}


def render(timeline, fmt: str, fps: int) -> bytes:
    """`timeline` in format `fmt`, checked by reading it back with the same adapter: the video track
    must come back with as many clips and the same length."""
    import opentimelineio as otio

    adapter = FORMATS[fmt][1]
    rate = fps if fmt == "otio" else timecode_rate(fps)
    source = timeline if fmt == "otio" else _at_rate(timeline, rate)
    try:
        text = otio.adapters.write_to_string(source.deepcopy(), adapter_name=adapter, **(
            {"rate": rate} if adapter == "cmx_3600" else {}))
        back = otio.adapters.read_from_string(text, adapter_name=adapter, **(
            {"rate": rate} if adapter == "cmx_3600" else {}))
    except Exception as e:       # an adapter raises its own kinds of errors
        raise OutputError(f"stitch timeline: the {adapter} adapter failed: {type(e).__name__}: {e}") from e
    want, got = timeline.video_tracks()[0], back.video_tracks()[0] if back.video_tracks() else None
    clips = lambda track: [c for c in track if isinstance(c, otio.schema.Clip)]     # noqa: E731
    if got is None or len(clips(got)) != len(clips(want)) or \
            abs(got.duration().to_seconds() - want.duration().to_seconds()) > 0.5 / fps:
        raise OutputError(f"stitch timeline: the {adapter} adapter does not read back what it wrote "
                          f"({len(clips(got)) if got else 0} clips, not {len(clips(want))}); nothing was written")
    return text.encode()


def write(timeline, formats: list[str], film: Path, fps: int, *, overwrite: bool, root: Optional[str]) -> list[Path]:
    """Write `timeline` in each format beside `film` (through a temporary and a no-replace rename,
    vidgen.io.atomic_write_bytes); every file is made before the first is put in place."""
    data = {fmt: render(timeline, fmt, fps) for fmt in formats}
    return [atomic_write_bytes(path, data[fmt], overwrite=overwrite, root=root)
            for fmt, path in paths(film, formats).items()]
