"""What a model folder holds before any of it is read: code that something might run, and entries
that are not files (a FIFO or device blocks whoever opens it). Asked by loading (model folders) and
sources (tokenizer folders); no file here is opened but JSON and the headers of safetensors weights
(`check_weights`). A `Scan` is one folder as read once: sources hands its scans to loading, so one
preflight opens each JSON file once."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import ModelLoadError
from .records import (MAX_JSON_BYTES, describe, integer_problem, integer_tensors, parse_json_object, path_problem,
                      read_json_bytes, safe_name, safetensors_header)

# Code in a model folder runs only if something trusts it: transformers imports the module an
# `auto_map` names (after a y/N prompt that hangs a queue worker), diffusers a `custom_pipeline`.
# vidgen trusts none, and refuses a folder that carries any rather than half-load it.
CODE_SUFFIXES = (".py", ".pyc")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
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


def json_texts(root: Path, known: dict[Path, bytes] | None = None) -> dict[Path, bytes]:
    """The bytes of each JSON file of the folder and its components (root/*.json, root/*/*.json) that is a
    regular file of a config's size; the others are left to whoever reads them (and reports them).
    `known`: files already read (path -> bytes), not read again; the others are added to it."""
    out = {}
    known = {} if known is None else known
    for path in sorted([*root.glob("*.json"), *root.glob("*/*.json")]):
        if path in known:
            out[path] = known[path]
            continue
        try:
            if not path.is_file() or path.stat().st_size > MAX_JSON_BYTES:
                continue        # the component checks report an unreadable or oversized config
            out[path] = known[path] = path.read_bytes()
        except OSError:
            continue
    return out


def custom_code(root: Path, texts: dict[Path, bytes] | None = None) -> list[str]:
    """Code files in the folder tree and JSON files of the folder and its components naming code to run
    (`texts`: their bytes, json_texts(root), when already read)."""
    found = [_shown(str((here / n).relative_to(root))) for here, names in _walk(root) for n in names
             if n.endswith(CODE_SUFFIXES)]
    for path, data in (json_texts(root) if texts is None else texts).items():
        # Most files (tokenizer.json is megabytes) are skipped unparsed by a byte search; any \u escape
        # could spell a key, so such a file is parsed.
        if not any(k in data for k in (b'"auto_map"', b'"custom_pipeline"', b"\\u")):
            continue
        obj = parse_json_object(data, path.name, [])
        rel = _shown(str(path.relative_to(root)))
        found += [f"{rel}'s {key!r} entry" for key in CODE_KEYS if obj is not None and key in obj]
    return found


class Scan:
    """One folder as read once: its code (custom_code), its entries that are not files
    (special_files), and its JSON files (json), each file opened at most once."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._texts: dict[Path, bytes] = {}         # every JSON file read, by path
        self._found: dict[str, list[str]] = {}

    def custom_code(self) -> list[str]:
        if "code" not in self._found:
            self._found["code"] = custom_code(self.root, json_texts(self.root, self._texts))
        return self._found["code"]

    def special_files(self) -> list[str]:
        if "special" not in self._found:
            self._found["special"] = special_files(self.root)
        return self._found["special"]

    def json(self, path: Path, what: str, problems: list[str]) -> dict | None:
        """The JSON object in the file `path`, or None with its problem appended (records.read_json_object),
        from the bytes read before where it was."""
        path = Path(path)
        if path not in self._texts:
            data = read_json_bytes(path, what, problems)
            if data is None:
                return None
            self._texts[path] = data
        return parse_json_object(self._texts[path], what, problems)


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


def refuse_special_files(scan: Scan, what: str = "model folder") -> None:
    root = scan.root
    if found := scan.special_files():
        shown = "; ".join(found[:3]) + (f"; and {len(found) - 3} more" if len(found) > 3 else "")
        one = len(found) == 1
        entries = "an entry that is not a regular file" if one else f"{len(found)} entries that are not regular files"
        raise ModelLoadError(f"{what} {root} holds {entries} ({shown}); a model folder holds files and folders "
                             f"only: replace {'it with the real file' if one else 'them with the real files'}")


def refuse_custom_code(scan: Scan) -> None:
    root = scan.root
    if found := scan.custom_code():
        shown = "; ".join(found[:5]) + (f"; and {len(found) - 5} more" if len(found) > 5 else "")
        raise ModelLoadError(f"model folder {root} holds custom code ({shown}); vidgen never runs code from a "
                             f"model folder: remove {'it' if len(found) == 1 else 'them'}")


# --------------------------------------------------------------------------------------------
# Weights in a component folder (headers only)


def check_weights(scan: Scan, folder: Path, name: str, missing: list[str], problems: list[str],
                   headers: dict[Path, dict]) -> None:
    """Safetensors weights in a component `folder` of `scan`'s, as problems: each file's header (kept in
    `headers` when sound), and any shard index and the files it names."""
    if not folder.is_dir():
        return                          # reported as a missing config.json
    files = sorted(p.name for p in folder.iterdir())
    weights = [n for n in files if n.endswith(".safetensors")]
    indexes = [n for n in files if n.endswith(".safetensors.index.json")]
    if not weights and not indexes:
        pickles = [n for n in files if n.endswith(PICKLE_SUFFIXES)]
        if pickles:
            problems.append(f"{folder} has only pickle weights ({', '.join(_shown(n) for n in pickles)}); vidgen "
                            f"loads safetensors only — convert them (e.g. save_pretrained(safe_serialization=True))")
        else:
            missing.append(f"{folder}/*.safetensors (no weights)")
        return
    for n in weights:
        header, problem = safetensors_header(folder / n)
        if problem:
            problems.append(f"{name}/{_shown(n)} {problem}; replace it with the original file")
        elif found := integer_tensors(header):
            problems.append(integer_problem(f"{name}/{_shown(n)}", found))
        else:
            headers[folder / n] = header
    for n in indexes:
        _check_shard_index(scan, folder, f"{name}/{_shown(n)}", n, set(weights), problems)


def _check_shard_index(scan: Scan, folder: Path, what: str, file: str, present: set[str], problems: list[str]) -> None:
    """A sharded checkpoint's index: an object whose weight_map maps tensor names to shard files here."""
    index = scan.json(folder / file, what, problems)
    if index is None:
        return
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(v, str) for v in weight_map.values()):
        problems.append(f"{what}: weight_map is {describe(weight_map)} (expected an object mapping tensor names "
                        f"to shard files)")
        return
    shards = set(weight_map.values())
    # A shard is a file beside the index: diffusers and transformers join the name to the folder,
    # so "../x" would read outside the model.
    outside = sorted(n for n in shards if Path(n).name != n or n in ("", ".", ".."))
    absent = sorted(n for n in shards - set(outside) if n not in present)
    if outside:
        problems.append(f"{what}: weight_map names {len(outside)} file(s) outside the folder "
                        f"({', '.join(_shown(n) for n in outside[:3])}); shards must sit beside the index")
    if absent:
        problems.append(f"{what}: weight_map names {len(absent)} safetensors file(s) that are not in the folder "
                        f"({', '.join(_shown(n) for n in absent[:3])}{', ...' if len(absent) > 3 else ''}); "
                        f"download the missing shards")
