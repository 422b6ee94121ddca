"""Animation workflows (workflows/*.yaml): shots rendered as queue jobs, then stitched and summarised.

    name: demo-shapes
    output_dir: outputs/demo-shapes          # relative to the current directory, or absolute
    defaults:                                # every shot starts from these
      config: configs/demo.yaml              # a render preset (optional)
      sampling.steps: 10                     # render-config keys, nested or dotted
    shots:
      - {name: red-right, prompt: a red circle moving right on a black background, seconds: 2}
      - {prompt: a blue square moving up on a gray background, seed: 3, overrides: {fps: 8}}
    steps:
      stitch: {output: demo-shapes.mp4, crossfade: 0.25, audio: {path: score.wav}, timeline: [otio, edl]}
      contact_sheet: {output: sheet.png, columns: 2}

`load_workflow` raises one ConfigError listing every problem: the workflow's keys, each shot's
merged render config (checked by `load_config`, prefixed by the shot), duplicate names, missing
images, crossfades longer than a shot, output names that would leave `output_dir`, and what the
stitch would refuse (vidgen.queue.stitching). Relative paths (`config`, `image`, `model.path`,
`output_dir`, the stitch's `audio.path`) start at the current directory and are stored absolute, so
a queued job does not depend on where its worker starts. `plan_jobs` makes one render job per shot,
then stitch and contact_sheet jobs depending on all of them (their payloads and executors are in
vidgen.queue.steps).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any, Optional

from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..config import CODECS, MAX_FPS, LoraConfig, RenderConfig, frames_for_seconds, random_seed, text_problems, to_dict
from ..config_files import map_files
from ..errors import ConfigError
from ..io import literal, output_path, slug
from ..paths import check_targets
from ..presets import (build, check_tree, fill_in, load_config, overrides_conf, reference_problem, resolver_problems,
                       unshelve, yaml_error)
from .ledger import JobSpec
from . import edits, review, takes
from .steps import WORKFLOW_OVERWRITE, ContactSheetJob
from .stitching import StitchStep, check_stitch, stitch_job

log = logging.getLogger("vidgen")

# A shot name becomes part of a file name: no separators, no leading dot, nothing a shell mangles.
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# Shot fields that must not come in again through `overrides` (two places, one value: confusing).
_SHOT_FIELDS = ("prompt", "seed", "num_frames", "image", "last_image", "loras")


# ------------------------------------------------------------------------------- schema (as written)


@dataclass
class ShotSpec:
    prompt: str = MISSING
    """What this shot shows."""
    name: Optional[str] = None
    """Names the shot's file (shots/NN-<name>.mp4), job and label; default: a slug of the prompt."""
    seed: Optional[int] = None
    """Noise seed; null = the defaults' seed."""
    num_frames: Optional[int] = None
    """Frames (4k+1); or give `seconds`; neither = the defaults' num_frames."""
    seconds: Optional[float] = None
    """Length in seconds, converted to the nearest 4k+1 frames at the shot's fps (the rounding is noted)."""
    image: Any = None
    """Conditioning image for image-to-video models: a path, or {from: SHOT, frame: last | first | N}
    to continue from a frame of an earlier shot (kept losslessly when that shot renders)."""
    last_image: Any = None
    """The shot's last frame (first-last-frame, Wan2.2 I2V-A14B): a path or {from: SHOT, frame: ...}."""
    extend: Any = None
    """{from: SHOT, frames: N}: continue SHOT from its last N frames, kept as they are (a VACE model;
    num_frames counts them); the stitch shows them once (vidgen.queue.edits)."""
    repaint: Any = None
    """{from: SHOT, mask: PATH}: render SHOT again where the mask is white, keeping the rest (a VACE
    model); it takes SHOT's place in the stitch and contact sheet."""
    animate: dict[str, Any] = field(default_factory=dict)
    """Wan2.2-Animate: the shot's animate: section (mode, pose_video, face_video, background_video,
    mask_video, segment_frames, overlap_frames), each video a path or {from: SHOT}: that shot's rendered
    video (a rig's pose pass), which this shot waits for."""
    continuity: dict[str, Any] = field(default_factory=dict)
    """{overlap_frames: K (4k+1), fuse: none | linear, colour: none | match_first | match_reference,
    reference: PATH or {from: ...}, window_frames: N, prompts: [{at: FRAME, prompt: TEXT}], keyframes:
    [{at: FRAME, image: PATH}]}: a shot longer than the model's clip renders as windows sharing K frames,
    each with the prompt in force at its start, one ending on each key frame (vidgen.queue.takes)."""
    loras: Optional[list[LoraConfig]] = None
    """LoRA files for this shot ([] = none), replacing the defaults' `loras`; null = the defaults'."""
    takes: Any = None
    """Render the shot N times (seeds seed, seed+1, ...), or once per seed of a list; needs review."""
    review: Any = None
    """true or {decode: preview | full}: a person approves one take, which alone goes on (vidgen.queue.review)."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """Render-config keys for this shot only, e.g. {sampling.steps: 30, size: 832x480}."""


@dataclass
class ContactSheetStep:
    output: str = MISSING
    """PNG file name under output_dir, e.g. sheet.png."""
    columns: int = 4
    """Cells per row (fewer when there are fewer shots)."""
    labels: bool = True
    """Caption each cell with the shot's name."""

    def problems(self) -> list[str]:
        out = [f"steps.contact_sheet.columns: {self.columns} must be >= 1"] if self.columns < 1 else []
        if not self.output.lower().endswith(".png"):
            out.append(f"steps.contact_sheet.output: {self.output!r} must end in .png")
        return out


@dataclass
class _Document:  # the top level as written; shots and steps are checked entry by entry
    name: str = MISSING
    """Names the workflow's jobs (<name>/<shot>) and their group in the ledger."""
    output_dir: str = MISSING
    """Every output goes under it; relative to the current directory, or absolute."""
    defaults: dict[str, Any] = field(default_factory=dict)
    """`config:` (a render preset file) and render-config keys shared by every shot."""
    shots: list[Any] = field(default_factory=list)
    """ShotSpec mappings, rendered in this order."""
    steps: dict[str, Any] = field(default_factory=dict)
    """stitch: StitchStep, contact_sheet: ContactSheetStep; both run after every shot."""
    overwrite: bool = False
    """Replace the outputs of an earlier run (shots, stitched film, sheet); otherwise an existing one is an error."""


_STEPS = {"stitch": StitchStep, "contact_sheet": ContactSheetStep}

@dataclass
class Shot:
    name: str
    config: RenderConfig
    """The shot's validated render config; output.path is inside the workflow's output_dir."""
    take: str = ""
    """The shot a window belongs to (a long take renders as windows); "" = the shot itself."""
    joins: bool = False
    """A window after the first: it starts on the previous window's last frame (the stitch drops it)."""
    deps: list[int] = field(default_factory=list)
    """Earlier entries of Workflow.shots whose kept frames this one starts from, ends on, or matches colour to."""
    refs: dict[str, Any] = field(default_factory=dict)
    """While loading: image / last_image / reference given as {from, frame}, and extend / repaint
    (vidgen.queue.takes and vidgen.queue.edits resolve them)."""
    extends: Optional[int] = None
    """The entry whose last `overlap` frames this one starts with (extend; a repaint of such a shot too)."""
    overlap: int = 0
    replaces: Optional[int] = None
    """The entry this one repaints: it takes that one's place in the stitch and contact sheet."""
    continuity: dict[str, Any] = field(default_factory=dict)
    takes: Any = None               # as written: a count or a list of seeds (fixed when the jobs are planned)
    review: Optional[str] = None    # how the takes decode for review (preview | full); None = no review gate


@dataclass
class Workflow:
    name: str
    output_dir: Path
    """Absolute; every output of the workflow is inside it."""
    shots: list[Shot]
    stitch: Optional[StitchStep] = None
    contact_sheet: Optional[ContactSheetStep] = None
    source: Optional[Path] = None
    notes: list[str] = field(default_factory=list)
    """What was rounded (seconds to frames, crossfade to frames); also logged."""
    overwrite: bool = False


def is_workflow(path: str | os.PathLike) -> bool:
    """True if `path` is a YAML mapping with a `shots:` key (a workflow, not a render config)."""
    try:
        raw = OmegaConf.load(path)
    except Exception:  # unreadable or not YAML: let the render-config loader say why
        return False
    return isinstance(raw, DictConfig) and "shots" in raw


def load_workflow(path: str | os.PathLike, overrides: list[str] | dict | None = None) -> Workflow:
    """Read, merge and validate a workflow file; nothing is rendered or queued.

    Args:
        path: the workflow YAML.
        overrides: render-config KEY=VALUE strings (or a dict) applied to every shot, after the
            shot's own settings, e.g. ["sampling.steps=4"].
    Returns:
        Workflow with one validated RenderConfig per shot.
    Raises:
        ConfigError listing every problem found, each with its key path.
    """
    label = str(path)
    try:
        doc = OmegaConf.load(path)
    except FileNotFoundError:
        raise ConfigError(f"workflow file {label!r} does not exist") from None
    except Exception as e:  # YAML syntax errors come in several classes
        raise yaml_error(Path(label).name, e) from None
    if not isinstance(doc, DictConfig):
        raise ConfigError("a workflow must be a mapping with name:, output_dir:, defaults:, shots:, steps:", label)
    problems: list[str] = []
    unresolved: set[int] = set()     # shots whose `${key}` references cannot be filled in (reported)
    plain = _resolve(doc, label, problems, unresolved)    # references filled in once; from here on, text
    if bad := text_problems(plain):     # NUL or a lone surrogate (a JSON submission can hold them): all at once
        raise ConfigError(problems + bad, label)
    _expect(plain, "", problems, defaults=(dict, "a mapping of render-config keys (config:, size:, ...)"),
            shots=(list, "a list of shots (- prompt: ...)"), steps=(dict, "a mapping (stitch:, contact_sheet:)"))
    check_tree(_Document, plain, "", problems)
    for key in ("name", "output_dir"):
        if not str(plain.get(key, "")).strip() or plain.get(key) == "???":
            problems.append(f"{key}: is required and not set")
    if not plain.get("shots"):
        problems.append("shots: is empty; list at least one shot with a prompt")
    output_dir = Path(_absolute(str(plain.get("output_dir") or ".")))
    if re.search(r"[{}]", str(plain.get("output_dir", ""))):
        problems.append(f"output_dir: {plain['output_dir']!r} contains {{ or }}, which output paths "
                        "read as placeholders; choose a folder name without braces")

    try:
        extra = overrides_conf(overrides)
    except ConfigError as e:
        problems += e.problems
        extra = OmegaConf.create()
    problems += _owned("overrides: ", OmegaConf.to_container(extra))
    overwrite = plain.get("overwrite") is True
    config_file, settings, base_fps = _defaults(plain.get("defaults", {}), problems)
    seen: set[str] = set(problems)  # a defaults problem shows up again in every shot: report it once
    notes: list[str] = []
    raw_shots = plain.get("shots") or []
    if overwrite:       # the workflow's own outputs are replaceable: the shots' too
        settings = {**settings, "output.overwrite": True}
    results = [_shot(i, raw, config_file, settings, extra, base_fps, output_dir, len(raw_shots), problems, seen, notes)
               if i not in unresolved else (_written_name(doc, i), None) for i, raw in enumerate(raw_shots)]
    names: dict[str, int] = {}
    for i, (name, _) in enumerate(results):
        if name and (first := names.setdefault(name.lower(), i)) != i:
            problems.append(f"shots[{i}].name: {name!r} is also the name of shots[{first}]; names must be unique "
                            "(ignoring case), as they name the output files")
    shots = [shot for _, shot in results if shot is not None]
    # Continuity is checked with the other problems, on the shots that are valid: a reference to a shot
    # with problems of its own waits for them (its length and frames are not known yet).
    broken = {name.lower() for name, shot in results if shot is None and name}
    shots = takes.expand([_without_refs_to(shot, broken) for shot in shots], output_dir, problems, notes)
    problems += review.shot_problems(shots)

    steps = _steps(plain.get("steps") or {}, problems)
    wf = Workflow(str(plain.get("name", "")), output_dir, shots, steps.get("stitch"), steps.get("contact_sheet"),
                  Path(path), notes, overwrite)
    if wf.stitch:
        _confine("steps.stitch.output", wf.stitch.output, output_dir, problems)
        check_stitch(wf, problems, notes)
    if wf.contact_sheet:
        _confine("steps.contact_sheet.output", wf.contact_sheet.output, output_dir, problems)
    for key, step in (("steps.stitch.output", wf.stitch), ("steps.contact_sheet.output", wf.contact_sheet)):
        if step is not None and not any(p.startswith(key) for p in problems):
            problems += check_targets([(key, output_dir / step.output)], overwrite=overwrite, root=output_dir,
                                      overwrite_hint=WORKFLOW_OVERWRITE)
    if problems:
        raise ConfigError(problems, label)
    for note in notes:
        log.info("%s: %s", wf.name, note)
    return wf


def _resolve(doc: DictConfig, label: str, problems: list[str], unresolved: set[int]) -> dict:
    """The workflow as plain values with its `${key}` references filled in (resolvers refused): the
    whole document at once, or, where a reference cannot be filled in, each shot on its own, so one
    shot's bad reference is reported with every other problem (its index goes in `unresolved`)."""
    if found := resolver_problems(OmegaConf.to_container(doc, resolve=False)):
        raise ConfigError(found, label)
    try:
        return fill_in(doc, label)
    except ConfigError:
        if not isinstance(doc.get("shots"), ListConfig):
            raise
    plain = fill_in(OmegaConf.masked_copy(doc, [k for k in doc if k != "shots"]), label)
    plain["shots"] = []
    for i in range(len(doc.shots)):
        try:
            node = doc.shots[i]
            plain["shots"].append(OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node)
        except (OmegaConfBaseException, RecursionError) as e:
            problems.append(reference_problem(e, f"shots[{i}]"))
            plain["shots"].append(None)
            unresolved.add(i)
    return plain


def _written_name(doc: DictConfig, i: int) -> str:
    """Shot i's name as written (for a shot whose references cannot be filled in), or ""."""
    shot = OmegaConf.to_container(doc.shots, resolve=False)[i]
    name = shot.get("name") if isinstance(shot, dict) else None
    return name if isinstance(name, str) and "${" not in name else ""


def _without_refs_to(shot: Shot, broken: set[str]) -> Shot:
    """`shot` without its {from: SHOT} references to the shots in `broken` (those are reported on their own)."""
    def to_broken(ref: Any) -> bool:
        return isinstance(ref, dict) and str(ref.get("from", "")).lower() in broken

    refs = {k: v for k, v in shot.refs.items() if not to_broken(v)}
    continuity = dict(shot.continuity)
    if to_broken(continuity.get("reference")):
        continuity.pop("reference")
        continuity["colour"] = "none"
    return dataclasses.replace(shot, refs=refs, continuity=continuity)


def _defaults(raw: dict, problems: list[str]) -> tuple[Optional[str], dict, Optional[int]]:
    """Split `defaults:` into the preset file and its settings; validate them once, on their own."""
    settings = dict(raw)
    config_file = settings.pop("config", None)
    if config_file is not None and not isinstance(config_file, str):
        problems.append(f"defaults.config: {config_file!r} is not a file path; e.g. configs/demo.yaml")
        config_file = None
    problems += _owned("defaults.", settings)
    try:
        # A placeholder prompt: shots bring their own, and a missing one is reported per shot.
        cfg = load_config(config_file, {**settings, "prompt": "workflow defaults"})
        return config_file, settings, cfg.fps
    except ConfigError as e:
        problems += [f"defaults: {p}" for p in e.problems]
        return config_file, settings, None
    except OmegaConfBaseException as e:
        problems.append(f"defaults: {str(e).splitlines()[0]}")
        return config_file, {}, None


def _shot(i: int, raw: Any, config_file: Optional[str], settings: dict, extra: DictConfig, base_fps: Optional[int],
          output_dir: Path, count: int, problems: list[str], seen: set[str],
          notes: list[str]) -> tuple[Optional[str], Optional[Shot]]:
    """Validate shot `i` and merge it into a render config: (its name, the Shot or None if invalid)."""
    where = f"shots[{i}]"
    if not isinstance(raw, dict):
        problems.append(f"{where}: expected a mapping (prompt:, name:, seed:, ...), got {raw!r}")
        return None, None
    before = len(problems)
    _expect(raw, where + ".", problems, overrides=(dict, "a mapping of render-config keys, e.g. {sampling.steps: 30}"))
    check_tree(ShotSpec, raw, where + ".", problems)
    if no_prompt := "prompt" not in raw:
        if not any(p.startswith(f"{where}.prompt:") for p in problems[before:]):
            problems.append(f"{where}.prompt: is required and not set")
        raw["prompt"] = "x"  # so the rest of the shot is still checked
    spec: ShotSpec = build(ShotSpec, raw)
    if spec.name is not None:
        _confine(f"{where}.name", spec.name, output_dir, problems, plain=True)
    name = spec.name or ("" if no_prompt else slug(spec.prompt, 32))  # "": nothing to name it after
    problems += _owned(f"{where}.overrides.", spec.overrides)
    problems += [f"{where}.overrides.{k}: use the shot's own `{k}:` key instead"
                 for k in _flat_keys(spec.overrides) if k in _SHOT_FIELDS]

    refs = {k: getattr(spec, k) for k in ("image", "last_image") if isinstance(getattr(spec, k), dict)}
    for k, value in refs.items():
        setattr(spec, k, None)
        problems += takes.ref_problems(value, f"{where}.{k}")
    problems += edits.verb_problems(spec, where)
    for k, value in list(spec.animate.items()):        # a driving video rendered by an earlier shot
        if isinstance(value, dict):         # a stand-in name until takes.expand puts that shot's video there
            refs[f"animate.{k}"] = value
            spec.animate[k] = f"(the video of shot {value.get('from')})"
            problems += [f"{where}.animate.{k}: {p}" for p in _performance_problems(k, value)]
    refs.update({k: getattr(spec, k) for k in edits.VERBS if isinstance(getattr(spec, k), dict)})
    problems += takes.continuity_problems(spec.continuity, f"{where}.continuity")
    problems += review.review_problems(spec.takes, spec.review, where)
    shot_fields = {k: getattr(spec, k) for k in _SHOT_FIELDS if getattr(spec, k) is not None}
    if spec.animate:
        shot_fields["animate"] = spec.animate
    if "loras" in shot_fields:
        shot_fields["loras"] = [dataclasses.asdict(lora) for lora in shot_fields["loras"]]
    try:     # values as text (overrides_conf of a dict); `extra` holds the command line's own YAML
        merged = OmegaConf.merge(overrides_conf(settings), overrides_conf(shot_fields),
                                 overrides_conf(spec.overrides), extra)
    except (OmegaConfBaseException, ConfigError) as e:
        msg = e.problems[0] if isinstance(e, ConfigError) else str(e).splitlines()[0]
        problems.append(f"{where}.overrides: {msg}")
        return name, None
    key, where = where, f"{where} ({name})" if name else where  # config problems name the shot as well
    image = _peek(merged, "image")
    problems += _missing_image(where, image)
    problems += _missing_image(where, _peek(merged, "last_image"), "last_image")
    if spec.seconds is not None:
        fps = _peek(merged, "fps", base_fps)
        if spec.num_frames is not None:
            problems.append(f"{where}: give num_frames or seconds, not both")
        elif not spec.seconds > 0:
            problems.append(f"{key}.seconds: {spec.seconds} must be > 0")
        elif isinstance(fps, int) and not isinstance(fps, bool) and 0 < fps <= MAX_FPS:     # else load_config says why
            merged.num_frames, rounded = frames_for_seconds(spec.seconds, fps)
            notes += [f"{where}: {rounded}"] if rounded else []
    try:
        cfg = load_config(config_file, merged)
    except ConfigError as e:
        fresh = [p for p in e.problems if p not in seen and f"defaults: {p}" not in seen]
        problems += [f"{where}: {p}" for p in fresh]
        return name, None
    if cfg.image != image:  # an image named by the preset itself
        problems += _missing_image(where, cfg.image)
    if len(problems) > before:
        return name, None
    _absolute_inputs(cfg)
    ext = ".mp4" if cfg.output.codec == "auto" else CODECS[cfg.output.codec].extensions[0]
    cfg.output.path = str(output_dir / "shots" / f"{i + 1:0{max(2, len(str(count)))}d}-{name}{ext}")
    cfg.output.root = str(output_dir)       # every write of the shot is confined there when it happens
    return name, Shot(name, cfg, refs=refs, continuity=dict(spec.continuity), takes=spec.takes,
                      review=review.decode_of(spec.review))


def _steps(raw: Any, problems: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in _STEPS:
            problems.append(f"steps.{key}: unknown step; allowed: {', '.join(_STEPS)}")
        elif not isinstance(value, dict):
            problems.append(f"steps.{key}: expected a mapping (output:, ...), got {value!r}")
        else:
            before = len(problems)
            check_tree(_STEPS[key], value, f"steps.{key}.", problems)
            problems += [f"steps.{key}.output: is required and not set"] if "output" not in value else []
            if len(problems) == before:
                out[key] = build(_STEPS[key], value)
                problems += out[key].problems()
                if key == "stitch" and out[key].audio.path:        # an input: stored absolute, as a shot's image
                    out[key].audio.path = _absolute(out[key].audio.path)
    return out


def _owned(prefix: str, tree: Any) -> list[str]:
    """The workflow decides where shots are written (confined to output_dir); shots choose the rest."""
    return [f"{prefix}{k}: set by the workflow (every output goes under output_dir); remove it"
            for k in _flat_keys(tree) if k in ("output.path", "output.root")]


def _peek(conf: DictConfig, key: str, default: Any = None) -> Any:
    """A shot's merged value before its config loads (its text as given), or `default` when the value is
    not there or is a reference that only the whole config can fill in."""
    try:
        value = OmegaConf.select(conf, key, default=default)
    except OmegaConfBaseException:
        return default
    return unshelve(value)


def _missing_image(where: str, image: Any, key: str = "image") -> list[str]:
    if not isinstance(image, str) or Path(image).is_file():
        return []
    return [f"{where}: {key}: {image!r} does not exist (relative paths start at {os.getcwd()})"]


def _expect(raw: dict, prefix: str, problems: list[str], **kinds: tuple[type, str]) -> None:
    """Report (and drop) container values of the wrong kind, with a message better than a type name;
    drop empty ones too (a bare `steps:` in YAML is null and means none)."""
    for key, (kind, what) in kinds.items():
        if isinstance(value := raw.pop(key, None), kind):
            raw[key] = value
        elif value is not None:
            problems.append(f"{prefix}{key}: expected {what}, got {value!r}")


def _confine(key: str, name: str, output_dir: Path, problems: list[str], plain: bool = False) -> None:
    """Report `name` unless it is a relative path that stays inside `output_dir`, symlinks followed;
    with `plain`, unless it is a bare file name (_NAME_RE)."""
    parts = re.split(r"[\\/]", name)
    if plain and _NAME_RE.fullmatch(name):
        return
    if not name.strip():
        problems.append(f"{key}: is empty; give a file name inside output_dir")
    elif os.path.isabs(name) or PurePath(name).drive or name.startswith(("~", "\\")):
        problems.append(f"{key}: {name!r} is an absolute path; give a name relative to output_dir "
                        f"({output_dir}), e.g. {os.path.basename(name) or 'out.mp4'}")
    elif ".." in parts:
        problems.append(f"{key}: {name!r} contains '..', which would leave output_dir ({output_dir}); "
                        "outputs stay inside it")
    elif not (output_dir / name).resolve().is_relative_to(output_dir.resolve()):
        problems.append(f"{key}: {name!r} leads outside output_dir ({output_dir}) through a symbolic link")
    elif plain:
        problems.append(f"{key}: {name!r} is not a plain file name; use 1-64 letters, digits, '-', '_' or '.', "
                        "starting with a letter or digit")


def _performance_problems(key: str, value: dict) -> list[str]:
    """What is wrong with a shot's animate.<key>: {from: SHOT} as written."""
    if key not in ("pose_video", "face_video", "background_video", "mask_video"):
        return [f"a {{from: SHOT}} reference names a driving video; {key} is not one"]
    out = [f"{k}: unknown key; a performance from another shot is {{from: SHOT}}" for k in value if k != "from"]
    if not isinstance(value.get("from"), str) or not value.get("from"):
        out.append("from: give the name of an earlier shot")
    return out


def _flat_keys(tree: Any, prefix: str = "") -> list[str]:
    """{'output': {'path': x}, 'sampling.steps': 4} -> ['output.path', 'sampling.steps']."""
    if not isinstance(tree, dict):
        return [prefix.rstrip(".")] if prefix else []
    out: list[str] = []
    for key, value in tree.items():
        out += _flat_keys(value, f"{prefix}{key}.") if isinstance(value, dict) else [f"{prefix}{key}"]
    return out


# ------------------------------------------------------------------------------- planning


def plan_jobs(workflow: Workflow) -> list[JobSpec]:
    """One render job per shot (a reviewed shot: its takes and its review job), in order, then stitch and
    contact_sheet jobs depending on all of them.

    A shot whose seed is null gets one now, as in plan_single: every attempt renders the same clip.
    """
    group = workflow.name
    configs = [s.config if s.config.seed is not None else dataclasses.replace(s.config, seed=random_seed())
               for s in workflow.shots]
    jobs: list[JobSpec] = []
    final: list[int] = []           # per shot: the job that writes its file (a reviewed shot's review job)
    for s, cfg in zip(workflow.shots, configs):
        deps = [final[d] for d in s.deps]
        if s.review is None:
            jobs.append(JobSpec(kind="render", payload=to_dict(cfg), name=f"{group}/{s.name}", output=cfg.output.path,
                                group=group, deps=deps))
        else:
            seeds = s.takes if isinstance(s.takes, list) else [cfg.seed + k for k in range(s.takes or 1)]
            jobs += review.plan_takes(to_dict(cfg), f"{group}/{s.name}", seeds, s.review, group, deps, len(jobs))
        final.append(len(jobs) - 1)
    shown = edits.film(workflow.shots)              # a repaint in its source's place
    if workflow.stitch:
        jobs.append(stitch_job(workflow, final))
    if workflow.contact_sheet:
        sheet = workflow.contact_sheet
        heads = [workflow.shots[i] for i, _ in shown if not workflow.shots[i].joins]   # a long take: its first window
        job = ContactSheetJob([s.config.output.path for s in heads], str(workflow.output_dir / sheet.output),
                              sheet.columns, [s.take or s.name for s in heads] if sheet.labels else None,
                              workflow.overwrite, str(workflow.output_dir))
        jobs.append(JobSpec(kind="contact_sheet", payload=dataclasses.asdict(job), name=f"{group}/contact_sheet",
                            deps=final, output=job.output, group=group))
    return jobs


def _absolute(path: str) -> str:
    """`path` with ~ expanded, made absolute: a job runs the same whatever directory its worker starts in."""
    return os.path.abspath(os.path.expanduser(path))


def _absolute_inputs(cfg: RenderConfig) -> None:
    """Every file `cfg` reads (the schema's file fields, config.file_fields) made absolute; repo ids and
    registered names stay as they are, and the output is the workflow's or plan_single's to place."""
    map_files(cfg, _absolute, ("read", "folder", "image", "video"))


def plan_single(config_path: str | os.PathLike, overrides: list[str] | dict | None = None) -> list[JobSpec]:
    """One render job for a render config and overrides, validated now; paths stored absolute.

    The seed (random when null) and output.path's placeholders are fixed now, so every attempt of
    the job renders the same clip to the same file (a retry or a re-run after a crash is idempotent).
    """
    cfg = load_config(config_path, overrides)
    if problems := _missing_image("image", cfg.image):
        raise ConfigError([p.removeprefix("image: ") for p in problems], str(config_path))
    if cfg.seed is None:
        cfg.seed = random_seed()
    _absolute_inputs(cfg)
    cfg.output.path = literal(os.path.abspath(output_path(cfg.output.path, cfg.seed, cfg.prompt)))
    if cfg.output.root:
        cfg.output.root = _absolute(cfg.output.root)
    return [JobSpec(kind="render", payload=to_dict(cfg), name=slug(cfg.prompt, 32),
                    output=str(output_path(cfg.output.path, cfg.seed, cfg.prompt)))]
