"""What a config field is beyond its type: the files it names (FileMark) and the registered names it allows.

A leaf (it imports nothing of vidgen): config.py marks its fields with these and re-exports them.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from typing import Any, Literal

REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}")      # a Hugging Face repo id (org/name): model.path


FileKind = Literal["read", "folder", "image", "video", "write"]
"""read: a file or folder the render reads (weights, a LoRA, a blocklist; the engine cache, read and written);
folder: a model folder, every file in it read; image: an image preflight reads; video: a video file or a
folder of PNG frames preflight reads (control.video, control.mask, video2video.video); write: the render's output."""


@dataclass(frozen=True)
class FileMark:
    """What a config field names on disk (its dataclass field's metadata "file"): the service's roots,
    a queued job's absolute paths and preflight's image reads all take the files from the schema."""

    kind: FileKind
    names: tuple[str, ...] = ()     # values that are registered names, not files (guard.blocklists' default)
    suffix: str = ""                # only values ending so are files (guard.classifier: .onnx, else a name)
    repo_ids: bool = False          # a Hugging Face repo id is no file (model.path: the model cache)

    def names_file(self, value: Any) -> bool:
        """Whether `value` (a field's value, or one entry of a list field) names a file."""
        return (isinstance(value, str) and value != "" and value not in self.names and value.endswith(self.suffix)
                and not (self.repo_ids and is_repo_id(value)))


def _file(kind: FileKind, default: Any = None, **rule: Any) -> Any:
    """A dataclass field whose value names a file (FileMark)."""
    mark = {"file": FileMark(kind, **rule)}
    if isinstance(default, list):
        return field(default_factory=default.copy, metadata=mark)
    return field(default=default, metadata=mark)


def is_repo_id(value: str) -> bool:
    """A Hugging Face repo id (org/name) that is not a local path: kept as it is."""
    return bool(REPO_ID.fullmatch(value)) and not os.path.exists(os.path.expanduser(value))


def _choices(section: Any, prefix: str) -> list[str]:
    """A problem for each of `section`'s CHOICES fields (registered names) holding a name not in its list."""
    return [p for key, allowed in section.CHOICES.items()
            if (p := _choice(f"{prefix}.{key}".lstrip("."), getattr(section, key), allowed))]


def _choice(key: str, value: str, allowed: tuple[str, ...]) -> str | None:
    if value in allowed:
        return None
    close = difflib.get_close_matches(str(value), allowed, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{key}: {value!r} is not allowed{hint}; choose one of {', '.join(allowed)}"
