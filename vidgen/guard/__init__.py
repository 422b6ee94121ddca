"""Stage 6: the guardrail — prompt filter, frame-safety classifier, photosensitivity check.

Switched on with `guard.enabled: true` (docs/guard.md). It fails closed: an enabled check that
cannot run publishes nothing.

    check_prompt(cfg, prompt)      # before any model loads; GuardrailBlocked (exit 3) on a match
    load_classifier(cfg, device)   # the frame classifier on its backend (preflight: fails before sampling)
    frame_guard(cfg, fps=..., ...) # a FrameGuard for one clip's frames, or None when no frame check is on
    check_video(path, cfg)         # the frame checks on an existing video file -> GuardReport
    load_guard_config(overrides)   # a GuardConfig from guard.KEY=VALUE alone (`vidgen guard ...`)
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import torch

from ..config import GuardConfig, text_problems
from ..errors import ConfigError, GuardrailUnavailable, InputError, OutputError, VidgenError
from ..io import read_frames, video_fps
from ..presets import build, check_tree, overrides_conf, resolve
from . import backends
from .policy import Classifier, FrameGuard, GuardReport, check_prompt, enforce  # noqa: F401
from .tensorrt import EngineCache

log = logging.getLogger("vidgen")

def _frame_checks_on(cfg: GuardConfig) -> bool:
    return cfg.enabled and (cfg.frames or cfg.photosensitivity)


def load_classifier(cfg: GuardConfig, device: torch.device, *, chosen=None) -> Classifier:
    """The classifier `cfg.classifier` names, on the backend the ladder picks. `chosen`: where a
    chosen backend is kept for reuse (a Pipeline's memo.Memo; see backends.select_backend).

    Raises:
        ModelLoadError / GuardrailUnavailable: missing or mismatched weights, or no backend can run;
        the message says how to fix it or to set guard.frames=false.
    """
    from . import classifier as C      # onnx (a second to import): only when frames are scored

    name = cfg.classifier
    if name.endswith(".onnx"):
        path = Path(name).expanduser()
        if not path.is_file():
            raise ConfigError(f"guard.classifier: {name!r} is not a file; give an .onnx classifier or a registered "
                              f"name ({', '.join(C.CLASSIFIERS)})")
        factory, onnx_source = None, path                     # no torch module: no torch backend
    elif name in C.CLASSIFIERS:
        factory, onnx_source = C.CLASSIFIERS[name], C.ONNX_SOURCES.get(name)   # None: no ONNX graph
    else:
        raise ConfigError(f"guard.classifier: {name!r} is not a registered classifier ({', '.join(C.CLASSIFIERS)}) "
                          "or an .onnx file")
    try:
        backend = backends.select_backend(cfg.backend, factory, onnx_source, device, precision=cfg.precision,
                                          max_batch=cfg.batch_size, model=name,
                                          cache=EngineCache(cfg.engine_cache or None), chosen=chosen)
    except VidgenError:
        raise
    except Exception as e:
        raise GuardrailUnavailable(f"guard: the frame classifier {name!r} cannot be loaded ({type(e).__name__}: {e}); "
                                   "fix the setup or set guard.frames=false") from e
    return Classifier(name, backend, C.preprocess)


def frame_guard(cfg: GuardConfig, *, fps: float, width: int, height: int, device: torch.device,
                classifier: Classifier | None = None) -> FrameGuard | None:
    """The frame checks for one clip; `classifier`: the one preflight loaded (else loaded now)."""
    if not _frame_checks_on(cfg):
        return None
    if cfg.frames and classifier is None:
        classifier = load_classifier(cfg, device)
    return FrameGuard(cfg, fps=fps, width=width, height=height, classifier=classifier if cfg.frames else None)


def check_video(path: str | Path, cfg: GuardConfig) -> GuardReport:
    """Run the enabled frame checks on an existing video (action is ignored: nothing is written).

    Raises InputError: the file cannot be read, holds no video stream (an audio file) or no frames.
    """
    cfg = replace(cfg, enabled=True, action="flag")
    checks = None
    try:                                   # the readers' OutputError: here the file is the user's input
        fps = video_fps(path) or 24.0      # a PNG folder declares no rate: assume film rate
        for frame in read_frames(path):    # one pass: the checks see frames as they are decoded
            if checks is None:
                h, w, _ = frame.shape
                checks = frame_guard(cfg, fps=fps, width=w, height=h, device=torch.device("cpu"))
                if checks is None:
                    return GuardReport(action="flag")
            checks.push(torch.from_numpy(frame))
    except OutputError as e:
        raise InputError(str(e)) from None
    if checks is None:
        raise InputError(f"{path} holds no video frames; give a video with at least one frame")
    return checks.finish()[1]


def load_guard_config(overrides: list[str] | dict | None = None) -> GuardConfig:
    """A GuardConfig from `guard.KEY=VALUE` overrides alone (for `vidgen guard ...`), validated."""
    plain = resolve(overrides_conf(overrides))
    problems: list[str] = []
    outside = [k for k in plain if k != "guard"]
    problems += [f"{k}: only guard.* keys apply here (e.g. guard.threshold=0.6)" for k in outside]
    raw = plain.get("guard", {}) if isinstance(plain.get("guard", {}), dict) else {}
    check_tree(GuardConfig, raw, "guard.", problems)
    cfg: GuardConfig = build(GuardConfig, raw)
    problems += cfg.problems() + text_problems(cfg, "guard")
    if problems:
        raise ConfigError(problems)
    return cfg
