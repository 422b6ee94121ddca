"""Stage 6: the guardrail — prompt filter, frame-safety classifier, photosensitivity check.

Switched on with `guard.enabled: true` (docs/guard.md). It fails closed: an enabled check that
cannot run publishes nothing.

    check_prompt(cfg, prompt)      # before any model loads; GuardrailBlocked (exit 3) on a match
    prepare(cfg, device)           # loads the classifier backend once per process (fails before sampling)
    frame_guard(cfg, fps=..., ...) # a FrameGuard for one clip's frames, or None when no frame check is on
    check_video(path, cfg)         # the frame checks on an existing video file -> GuardReport
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from ..config import GuardConfig
from ..errors import ConfigError, GuardrailUnavailable, InputError, VidgenError
from .policy import Classifier, FrameGuard, GuardReport, check_prompt, enforce  # noqa: F401

log = logging.getLogger("vidgen")

_LOADED: dict[tuple, Classifier] = {}


def _frame_checks_on(cfg: GuardConfig) -> bool:
    return cfg.enabled and (cfg.frames or cfg.photosensitivity)


def load_classifier(cfg: GuardConfig, device: torch.device) -> Classifier:
    """The classifier `cfg.classifier` names, on the backend the ladder picks (cached per process).

    Raises:
        ModelLoadError / GuardrailUnavailable: missing or mismatched weights, or no backend can run;
        the message says how to fix it or to set guard.frames=false.
    """
    from . import backends, classifier as C
    from .tensorrt import EngineCache

    key = (cfg.classifier, cfg.backend, cfg.precision, cfg.engine_cache, str(device))
    if key in _LOADED:
        return _LOADED[key]
    name = cfg.classifier
    if name.endswith(".onnx"):
        path = Path(name).expanduser()
        if not path.is_file():
            raise ConfigError(f"guard.classifier: {name!r} is not a file; give an .onnx classifier or a registered "
                              f"name ({', '.join(C.CLASSIFIERS)})")
        factory, onnx_source = _no_torch_module(name), path
    elif name in C.CLASSIFIERS:
        factory, onnx_source = C.CLASSIFIERS[name], C.ONNX_SOURCES.get(name) or _no_onnx_graph(name)
    else:
        raise ConfigError(f"guard.classifier: {name!r} is not a registered classifier ({', '.join(C.CLASSIFIERS)}) "
                          "or an .onnx file")
    try:
        backend = backends.select_backend(cfg.backend, factory, onnx_source, device, precision=cfg.precision,
                                          max_batch=cfg.batch_size, model=name,
                                          cache=EngineCache(cfg.engine_cache or None))
    except VidgenError:
        raise
    except Exception as e:
        raise GuardrailUnavailable(f"guard: the frame classifier {name!r} cannot be loaded ({type(e).__name__}: {e}); "
                                   "fix the setup or set guard.frames=false") from e
    loaded = _LOADED[key] = Classifier(name, backend, C.preprocess)
    return loaded


def _no_torch_module(name: str):
    def factory():
        raise RuntimeError(f"{name} is an ONNX file: the torch backend needs a registered torch module")
    return factory


def _no_onnx_graph(name: str):
    def source(fp16: bool):
        raise RuntimeError(f"classifier {name!r} was registered without an ONNX graph "
                           "(register_classifier(..., onnx_source=...))")
    return source


def prepare(cfg: GuardConfig, device: torch.device) -> None:
    """Load what the enabled frame checks need now, so a guard that cannot run fails before sampling."""
    if cfg.enabled and cfg.frames:
        load_classifier(cfg, device)


def frame_guard(cfg: GuardConfig, *, fps: float, width: int, height: int,
                device: torch.device) -> FrameGuard | None:
    if not _frame_checks_on(cfg):
        return None
    clf = load_classifier(cfg, device) if cfg.frames else None
    return FrameGuard(cfg, fps=fps, width=width, height=height, classifier=clf)


def check_video(path: str | Path, cfg: GuardConfig, device: torch.device | None = None) -> GuardReport:
    """Run the enabled frame checks on an existing video (action is ignored: nothing is written)."""
    from dataclasses import replace

    from ..io import iter_frames, video_fps

    fps = video_fps(path) or 24.0          # a PNG folder declares no rate: assume film rate
    cfg = replace(cfg, enabled=True, action="flag")
    checks = None
    for frame in iter_frames(path):        # one pass: the checks see frames as they are decoded
        if checks is None:
            h, w, _ = frame.shape
            checks = frame_guard(cfg, fps=fps, width=w, height=h, device=device or torch.device("cpu"))
            if checks is None:
                return GuardReport(action="flag")
        checks.push(torch.from_numpy(frame))
    if checks is None:
        raise InputError(f"{path}: holds no video frames")
    return checks.finish()[1]
