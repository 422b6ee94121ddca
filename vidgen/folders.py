"""What a model folder holds before any of it is read: code that something might run, and entries
that are not files (a FIFO or device blocks whoever opens it). Asked by loading (model folders) and
sources (tokenizer folders); no file here is ever opened but JSON that may name code."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import ModelLoadError
from .records import MAX_JSON_BYTES, parse_json_object, path_problem, safe_name

# Code in a model folder runs only if something trusts it: transformers imports the module an
# `auto_map` names (after a y/N prompt that hangs a queue worker), diffusers a `custom_pipeline`.
# vidgen trusts none, and refuses a folder that carries any rather than half-load it.
CODE_SUFFIXES = (".py", ".pyc")
CODE_KEYS = ("auto_map", "custom_pipeline")
_CODE_SCAN_DEPTH = 4        # root/component/file, and the .cache/huggingface/download/ of a local download


def _shown(rel: str) -> str:
    # A file name is the folder's content too: an odd one is escaped, so the message stays one line.
    return safe_name(rel, ascii(rel)).strip("'")


def _walk(root: Path):
    """(folder, its file names, sorted) down to _CODE_SCAN_DEPTH levels, folders in sorted order."""
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if len(here.relative_to(root).parts) >= _CODE_SCAN_DEPTH:
            dirnames.clear()
        dirnames.sort()
        yield here, sorted(filenames)


def custom_code(root: Path) -> list[str]:
    """Code files in the folder tree and JSON files of the folder and its components naming code to run."""
    found = [_shown(str((here / n).relative_to(root))) for here, names in _walk(root) for n in names
             if n.endswith(CODE_SUFFIXES)]
    for path in sorted([*root.glob("*.json"), *root.glob("*/*.json")]):
        try:
            if not path.is_file() or path.stat().st_size > MAX_JSON_BYTES:
                continue        # the component checks report an unreadable or oversized config
            data = path.read_bytes()
        except OSError:
            continue
        # Most files (tokenizer.json is megabytes) are skipped unread by a byte search; any \u escape
        # could spell a key, so such a file is parsed.
        if not any(k in data for k in (b'"auto_map"', b'"custom_pipeline"', b"\\u")):
            continue
        obj = parse_json_object(data, path.name, [])
        rel = _shown(str(path.relative_to(root)))
        found += [f"{rel}'s {key!r} entry" for key in CODE_KEYS if obj is not None and key in obj]
    return found


def special_files(root: Path) -> list[str]:
    """Entries of the folder tree that are neither files nor folders (a FIFO, a device, a socket, or a
    link to one), each as 'name is what it is': reading one blocks or never ends, so none is opened."""
    found = []
    for here, names in _walk(root):
        for n in names:
            try:
                mode = os.stat(here / n).st_mode
            except OSError:
                continue                # a broken link: whatever needs it says it is missing
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                what = (path_problem(here / n, "file") or "").removeprefix("is ").split(",")[0]
                found.append(f"{_shown(str((here / n).relative_to(root)))} is {what}")
    return found


def _refuse_special_files(root: Path, what: str = "model folder") -> None:
    if found := special_files(root):
        shown = "; ".join(found[:3]) + (f"; and {len(found) - 3} more" if len(found) > 3 else "")
        one = len(found) == 1
        entries = "an entry that is not a regular file" if one else f"{len(found)} entries that are not regular files"
        raise ModelLoadError(f"{what} {root} holds {entries} ({shown}); a model folder holds files and folders "
                             f"only: replace {'it with the real file' if one else 'them with the real files'}")


def _refuse_custom_code(root: Path) -> None:
    found = custom_code(root)
    if found:
        shown = "; ".join(found[:5]) + (f"; and {len(found) - 5} more" if len(found) > 5 else "")
        raise ModelLoadError(f"model folder {root} holds custom code ({shown}); vidgen never runs code from a "
                             f"model folder: remove {'it' if len(found) == 1 else 'them'}")
