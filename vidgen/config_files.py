"""Every file a config names, walked from the schema's marks (config.FileMark on each field).

The queue service's roots, a queued job's absolute paths and preflight's image and video reads all
take the files a config names from here, so a new field that names a file is one mark in config.py.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Iterator, get_args, get_origin, get_type_hints

from .config import FileKind, FileMark, RenderConfig


@functools.cache
def file_marks(schema: type = RenderConfig) -> dict[tuple[str | None, ...], FileMark]:
    """Every field of `schema` that names a file, by key path (None: each entry of a list), in the
    schema's order: {("model", "path"): FileMark("folder", ...), ("loras", None, "path"): ...}."""
    hints, out = get_type_hints(schema), {}
    for f in dataclasses.fields(schema):
        tp, listed = hints[f.name], get_origin(hints[f.name]) is list
        item = get_args(tp)[0] if listed else tp
        if "file" in f.metadata:
            out[(f.name, None) if listed else (f.name,)] = f.metadata["file"]
        elif dataclasses.is_dataclass(item):
            out |= {(f.name, *((None,) if listed else ()), *key): mark for key, mark in file_marks(item).items()}
    return out


def file_fields(data: Any) -> list[tuple[str, str, FileKind]]:
    """(key path, value, kind) for every file `data` (a RenderConfig, or its dict as to_dict makes
    it) names, marked in the schema (FileMark): ("model.path", "/m/wan", "folder"), ("loras[0].path",
    "/l/a.safetensors", "read"), ... Registered names, repo ids, null and "" are not files."""
    return [(key, value, mark.kind) for key, value, _, _, mark in _file_slots(data)]


def map_files(cfg: RenderConfig, change: Any, kinds: tuple[FileKind, ...]) -> None:
    """Replace, in place, each file `cfg` names of one of `kinds` by change(value)."""
    for _, value, holder, name, mark in _file_slots(cfg):
        if mark.kind in kinds and isinstance(holder, list):
            holder[name] = change(value)
        elif mark.kind in kinds:
            setattr(holder, name, change(value))


def _file_slots(data: Any) -> Iterator[tuple[str, str, Any, Any, FileMark]]:
    """(key path, value, holder, name or index in it, mark) for every file `data` names."""
    for parts, mark in file_marks().items():
        for key, holder, name in _slots(data, parts, ""):
            if mark.names_file(value := _get(holder, name)):
                yield key, value, holder, name, mark


def _slots(node: Any, parts: tuple[str | None, ...], key: str) -> Iterator[tuple[str, Any, Any]]:
    """(key path, holder, name or index) of each value at `parts` under `node` (dicts, lists, dataclasses)."""
    head, rest = parts[0], parts[1:]
    if head is None:
        found = [(f"{key}[{i}]", node, i) for i in range(len(node))] if isinstance(node, list) else []
    else:
        there = head in node if isinstance(node, dict) else dataclasses.is_dataclass(node) and hasattr(node, head)
        found = [(f"{key}.{head}".lstrip("."), node, head)] if there else []
    for k, holder, name in found:
        yield from _slots(_get(holder, name), rest, k) if rest else [(k, holder, name)]


def _get(holder: Any, name: Any) -> Any:
    return holder[name] if isinstance(holder, (dict, list)) else getattr(holder, name)
