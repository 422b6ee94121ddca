"""Text a file can hold: the check every config string and ledger field goes through (a leaf)."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal


def text_problems(value: Any, key: str = "") -> list[str]:
    """A problem for every string in `value` (a config, a section, a list, a string) that no file, sidecar or
    ledger can hold: a NUL character, or a lone surrogate (text decoded from bytes that were not UTF-8).
    Refused when the config loads, so a render never samples for minutes and then fails to write."""
    if isinstance(value, str):
        if (flaw := text_flaw(value)) is None:
            return []
        what, at = flaw
        if what == "nul":
            return [f"{key}: contains a NUL character (at position {at}); remove it"]
        return [f"{key}: contains a lone surrogate ({value[at]!r} at position {at}), which is not text a file can hold; "
                "fix the text's encoding"]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [p for f in dataclasses.fields(value)
                for p in text_problems(getattr(value, f.name), f"{key}.{f.name}".lstrip("."))]
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in text_problems(v, f"{key}[{i}]")]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in text_problems(v, f"{key}.{k}".lstrip("."))]
    return []


def text_flaw(text: str) -> tuple[Literal["nul", "surrogate"], int] | None:
    """What in `text` no file, sidecar or ledger can hold, and where: a NUL, or a lone surrogate (text
    decoded from bytes that were not UTF-8); None if any file can hold it."""
    if "\x00" in text:
        return "nul", text.index("\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return "surrogate", e.start
    return None
