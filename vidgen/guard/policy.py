"""The guard's policy: which checks run, which frames are scored, and what a flagged clip becomes.

Order in a render: `check_prompt` before any model loads; `prepare` (loads the classifier backend,
so a missing model fails before sampling, not after); then a `FrameGuard` sees every frame as it
leaves the VAE, before the writer, and `finish` decides. Actions: block (the writer's partial file
is deleted, GuardrailBlocked carries the report), blur (flagged frames pixelated; frames wait until
their nearest sampled frame is scored), flag (the report goes to the sidecar). Any error while a
check runs is raised as GuardrailUnavailable: the clip is never published unchecked.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import math
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from ..config import GuardConfig
from ..errors import GuardrailBlocked, GuardrailUnavailable, VidgenError
from .backends import check_probs
from .flash import FlashCheck
from .prompt_filter import load_rules, match_prompt

log = logging.getLogger("vidgen")

PIXELATE_BLOCKS = 16      # a blurred frame keeps this many blocks across its longer side


def check_prompt(cfg: GuardConfig, prompt: str) -> None:
    """Refuse a prompt that matches a blocklist rule (by rule name only).

    Raises:
        GuardrailBlocked: exit code 3.
    """
    if not (cfg.enabled and cfg.prompt_filter):
        return
    rule = match_prompt(prompt, load_rules(list(cfg.blocklists)))
    if rule is not None:
        log.info("guard: prompt refused by rule %r", rule)
        raise GuardrailBlocked(f"prompt refused by the guard's prompt filter (rule {rule!r}); nothing was rendered",
                               report={"prompt_filter": {"rule": rule}, "flagged": True, "action": "block"})


@dataclass
class GuardReport:
    """What the frame checks found; `checks` holds one dict per check with its scores."""

    flagged: bool = False
    action: str = "block"
    checks: dict = field(default_factory=dict)
    blurred_frames: int = 0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        parts = []
        c = self.checks.get("classifier")
        if c:
            parts.append(f"frame classifier {c['name']} ({c['backend']}): max unsafe score {c['max_score']:.3f} "
                         f"at frame {c['max_frame']}, {c['flagged_samples']} of {c['samples']} sampled frames "
                         f">= {c['threshold']}")
        p = self.checks.get("photosensitivity")
        if p:
            parts.append("photosensitivity: " + ("pass" if p["passed"] else p["reason"]))
        return "; ".join(parts) or "no frame checks enabled"


def pixelate(frame: torch.Tensor) -> torch.Tensor:
    """uint8 [H, W, 3] -> the same frame as coarse blocks (PIXELATE_BLOCKS across the longer side)."""
    h, w, _ = frame.shape
    block = max(1, math.ceil(max(h, w) / PIXELATE_BLOCKS))
    x = frame.permute(2, 0, 1)[None].float()
    small = F.avg_pool2d(x, block, ceil_mode=True)
    big = F.interpolate(small, scale_factor=block, mode="nearest")[..., :h, :w]
    return big[0].round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).contiguous()


class Classifier:
    """A loaded frame classifier: uint8 frames [B, H, W, 3] -> unsafe scores [B] (float, CPU)."""

    def __init__(self, name: str, backend, preprocess: Callable[[torch.Tensor], torch.Tensor]):
        self.name, self.backend, self.preprocess = name, backend, preprocess

    @property
    def backend_name(self) -> str:
        return self.backend.name

    def scores(self, frames: torch.Tensor) -> torch.Tensor:
        return check_probs(self.backend_name, self.backend(self.preprocess(frames)), frames.shape[0])[:, 1]


@contextmanager
def _failing_closed(check: str, disable: str):
    """Any error in `check` becomes GuardrailUnavailable: a check that breaks publishes nothing."""
    try:
        yield
    except VidgenError:
        raise
    except Exception as e:
        raise GuardrailUnavailable(f"the guard's {check} failed ({type(e).__name__}: {e}); the clip was not "
                                   "published. Fix the guard setup (vidgen info lists backends) or disable the "
                                   f"check ({disable})") from e


class FrameGuard:
    """Runs the enabled frame checks on a clip's frames as they stream out of the VAE.

    The classifier scores one frame every 1/sample_fps seconds from the first (frame round(k * fps /
    sample_fps)), and the last frame, in batches. `push(frame)` returns the frames that may be
    written now (in order); `finish()` the rest and the report. With action block or flag frames
    pass straight through; with blur a frame waits until the sampled frames on both sides of it
    are scored.
    """

    def __init__(self, cfg: GuardConfig, *, fps: float, width: int, height: int,
                 classifier: Classifier | None = None):
        self.cfg = cfg
        self.classifier = classifier if cfg.frames else None
        self._step = max(1.0, fps / cfg.sample_fps)   # frames between samples (the last frame is added at the end)
        self._k = 0                                   # the next periodic sample is round(_k * _step)
        self.samples: list[int] = []                  # sampled frame indices so far, in order
        self._last: torch.Tensor | None = None
        self._batch: list[tuple[int, torch.Tensor]] = []
        self.scores: dict[int, float] = {}          # frame index -> unsafe score
        self.flash = None
        if cfg.photosensitivity:
            self.flash = FlashCheck(fps, width, height)
        self._flash_chunk: list[torch.Tensor] = []
        self._pending: deque[tuple[int, torch.Tensor]] = deque()
        self._seen = 0
        self.blurred = 0

    # -- feeding -----------------------------------------------------------------------------
    def push(self, frame: torch.Tensor) -> list[torch.Tensor]:
        i = self._seen
        self._seen += 1
        if self.flash is not None:
            self._flash_chunk.append(frame)
            if len(self._flash_chunk) >= 16:
                self._flush_flash()
        self._last = frame
        if self.classifier is not None and i == round(self._k * self._step):
            self._k += 1
            self.samples.append(i)
            self._batch.append((i, frame))
            if len(self._batch) >= self.cfg.batch_size:
                self._score_batch()
        if self.cfg.action != "blur":
            return [frame]
        self._pending.append((i, frame))
        return self._release(final=False)

    def finish(self) -> tuple[list[torch.Tensor], GuardReport]:
        last = self._seen - 1
        if self.classifier is not None and last >= 0 and (not self.samples or self.samples[-1] != last):
            self.samples.append(last)
            self._batch.append((last, self._last))
        if self._batch:
            self._score_batch()
        self._flush_flash()
        with _failing_closed("photosensitivity check", "guard.photosensitivity=false"):
            flash = self.flash.result() if self.flash is not None else None
        report = self._report(flash)
        rest = self._release(final=True) if self.cfg.action == "blur" else []
        report.blurred_frames = self.blurred
        return rest, report

    # -- internals ---------------------------------------------------------------------------
    def _flush_flash(self) -> None:
        if self.flash is not None and self._flash_chunk:
            with _failing_closed("photosensitivity check", "guard.photosensitivity=false"):
                self.flash.update(torch.stack(self._flash_chunk).numpy())
            self._flash_chunk = []

    def _score_batch(self) -> None:
        idx = [i for i, _ in self._batch]
        with _failing_closed("frame classifier", "guard.frames=false"):
            scores = self.classifier.scores(torch.stack([f for _, f in self._batch]))
        self.scores.update(zip(idx, scores.tolist()))
        self._batch = []

    def _flagged(self, i: int) -> bool:
        """Whether frame i's nearest scored sample (either one, at a tie) is over the threshold."""
        if not self.samples:
            return False
        k = bisect.bisect_left(self.samples, i)
        near = [self.samples[j] for j in (k - 1, k) if 0 <= j < len(self.samples)]
        best = min(abs(s - i) for s in near)
        return any(self.scores.get(s, 0.0) >= self.cfg.threshold for s in near if abs(s - i) == best)

    def _release(self, final: bool) -> list[torch.Tensor]:
        out = []
        while self._pending:
            i, frame = self._pending[0]
            if not final and self.classifier is not None:
                k = bisect.bisect_left(self.samples, i)     # the sample at or after frame i
                if k == len(self.samples) or self.samples[k] not in self.scores:
                    break
            self._pending.popleft()
            if self._flagged(i):
                frame = pixelate(frame)
                self.blurred += 1
            out.append(frame)
        return out

    def _report(self, flash) -> GuardReport:
        checks, flagged = {}, False
        if self.classifier is not None:
            top = max(self.scores, key=self.scores.get) if self.scores else 0
            over = [i for i, s in self.scores.items() if s >= self.cfg.threshold]
            checks["classifier"] = {"name": self.classifier.name, "backend": self.classifier.backend_name,
                                    "threshold": self.cfg.threshold, "samples": len(self.scores),
                                    "flagged_samples": len(over), "flagged_frames": sorted(over),
                                    "max_score": round(self.scores.get(top, 0.0), 4), "max_frame": top,
                                    "scores": {str(i): round(s, 4) for i, s in sorted(self.scores.items())}}
            flagged |= bool(over)
        if flash is not None:
            checks["photosensitivity"] = flash.to_dict()
            flagged |= not flash.passed
        return GuardReport(flagged=flagged, action=self.cfg.action, checks=checks)


def enforce(report: GuardReport) -> None:
    """Raise GuardrailBlocked for a flagged clip the action does not publish.

    block: always; blur: when photosensitivity failed (pixelating frames does not remove flashes).
    """
    if not report.flagged:
        return
    flash_failed = not report.checks.get("photosensitivity", {}).get("passed", True)
    if report.action == "block" or (report.action == "blur" and flash_failed):
        raise GuardrailBlocked(f"the guard blocked the clip: {report.summary()}; nothing was written",
                               report=report.to_dict())
