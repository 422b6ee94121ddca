"""The one place that checks what vidgen reads from JSON files and safetensors headers.

Model folders, latents files and resume checkpoints come from outside: a truncated download, a
hand-edited config or a hostile file must end as one readable problem, never as a KeyError,
TypeError or library error deep inside loading. Every reader here checks type and range and
*collects* problems (`problems: list[str]`), so a caller can report all of them at once.

Problems describe values without echoing file contents: numbers and short identifiers are shown,
any other text only by its kind and size (`describe`). Nothing here loads tensor data or
unpickles anything; `check_safetensors` reads only the 8-byte length and the JSON header.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

from .errors import InputError

REQUIRED: Any = object()
"""`default` for a field that must be present."""

MAX_JSON_BYTES = 128 * 2**20
"""Largest JSON file read (real tokenizer.json files reach ~35 MB; configs are a few KB)."""
MAX_HEADER_BYTES = 100_000_000
"""safetensors' own limit on the JSON header (it refuses larger ones as "header too large")."""

# Bits per element of every dtype the safetensors format defines (safetensors 0.8's Dtype enum).
SAFETENSORS_DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64,
    "I64": 64, "U64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}

_NAME = re.compile(r"[A-Za-z0-9_.:/+-]{1,80}")


# --------------------------------------------------------------------------------------- describing

def describe(value: Any) -> str:
    """A short, safe description of a JSON value for an error message (at most ~60 characters)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        text = json.dumps(value)
        return text if len(text) <= 24 else f"a {len(text)}-character number"
    if isinstance(value, str):
        return repr(value) if _NAME.fullmatch(value) else f"a string of {len(value)} characters"
    if isinstance(value, list):
        if all(v is None or isinstance(v, (int, float)) or (isinstance(v, str) and _NAME.fullmatch(v)) for v in value):
            text = json.dumps(value)
            if len(text) <= 60:
                return text
        return f"a list of {len(value)} item{'' if len(value) == 1 else 's'}"
    if isinstance(value, dict):
        return f"an object with {len(value)} key{'' if len(value) == 1 else 's'}"
    return type(value).__name__


def safe_name(name: str, fallback: str) -> str:
    """`name` quoted if it is a plain identifier-like name, else `fallback` (a name is file content too)."""
    return repr(name) if isinstance(name, str) and _NAME.fullmatch(name) else fallback


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "true/false", type(None): "null"}.get(
        type(value), "a number")


# -------------------------------------------------------------------------------------------- JSON

def parse_json_object(text: str | bytes, what: str, problems: list[str]) -> dict | None:
    """The JSON object in `text`, or None with one problem appended (not JSON, or not an object)."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        value = json.loads(text)
    except UnicodeDecodeError:
        problems.append(f"{what} is not UTF-8 text")
        return None
    except RecursionError:
        problems.append(f"{what} is nested too deeply to be a config")
        return None
    except ValueError as e:
        where = f" (line {e.lineno} column {e.colno}: {e.msg})" if isinstance(e, json.JSONDecodeError) else ""
        problems.append(f"{what} is not valid JSON{where}")
        return None
    if not isinstance(value, dict):
        problems.append(f"{what} holds {_kind(value)}, not a JSON object")
        return None
    return value


def read_json_object(path: Path, what: str, problems: list[str]) -> dict | None:
    """The JSON object in the file `path`, or None with one problem appended (missing, unreadable,
    too large, not JSON, or not an object). `what` names the file in the problem."""
    data = read_json_bytes(path, what, problems)
    return None if data is None else parse_json_object(data, what, problems)


def read_json_bytes(path: Path, what: str, problems: list[str]) -> bytes | None:
    """The bytes of the JSON file `path`, or None with one problem appended (missing, not a regular
    file, too large, unreadable)."""
    try:
        if not path.is_file():
            problems.append(f"{what} {'is not a file' if path.exists() else 'does not exist'}")
            return None
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            problems.append(f"{what} is {size / 2**20:.0f} MiB, far too large for a JSON config")
            return None
        return path.read_bytes()
    except OSError as e:
        problems.append(f"{what} cannot be read ({e.strerror or type(e).__name__})")
        return None


# ------------------------------------------------------------------------------------ typed fields

def _take(d: dict, key: str, default: Any, where: str, problems: list[str]) -> tuple[bool, Any]:
    """(present and not null, its value or else the default); a missing REQUIRED field is a problem
    and gives None."""
    if key in d and d[key] is not None:
        return True, d[key]
    if default is REQUIRED:
        problems.append(f"{where}: {key} is {'null' if key in d else 'missing'}")
        return False, None
    return False, default


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)     # JSON true is not the integer 1


def _range(lo: Any, hi: Any) -> str:
    if hi is None:
        return f">= {lo}"
    return f"in {lo}..{hi}"


def int_field(d: dict, key: str, default: Any, lo: int, hi: int | None, where: str, problems: list[str]) -> Any:
    """d[key] as an int in lo..hi (hi None: no upper bound); absent or null -> default.

    A wrong value is a problem and gives `default` back, so checking can go on."""
    present, value = _take(d, key, default, where, problems)
    if not present:
        return value
    if not is_int(value) or value < lo or (hi is not None and value > hi):
        problems.append(f"{where}: {key} is {describe(value)} (expected an integer {_range(lo, hi)})")
        return None if default is REQUIRED else default
    return value


def float_field(d: dict, key: str, default: Any, where: str, problems: list[str], *,
                above: float | None = None, below: float | None = None) -> Any:
    """d[key] as a finite number strictly between `above` and `below` (either may be None)."""
    present, value = _take(d, key, default, where, problems)
    if not present:
        return value
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and ((above is not None and not value > above) or (below is not None and not value < below)):
        ok = False
    if not ok:
        if above is not None and below is not None:
            want = f"a number in ({above:g}, {below:g})"
        elif above is not None:
            want = f"a number > {above:g}"
        elif below is not None:
            want = f"a number < {below:g}"
        else:
            want = "a finite number"
        problems.append(f"{where}: {key} is {describe(value)} (expected {want})")
        return None if default is REQUIRED else default
    return float(value)


def int_tuple_field(d: dict, key: str, default: Any, length: int, lo: int, hi: int | None, where: str,
                    problems: list[str]) -> Any:
    """d[key] as a tuple of `length` ints, each in lo..hi."""
    present, value = _take(d, key, default, where, problems)
    if not present:
        return tuple(value) if isinstance(value, (list, tuple)) else value
    if (not isinstance(value, list) or len(value) != length
            or not all(is_int(v) and v >= lo and (hi is None or v <= hi) for v in value)):
        problems.append(f"{where}: {key} is {describe(value)} (expected {length} integers, each {_range(lo, hi)})")
        return None if default is REQUIRED else tuple(default)
    return tuple(value)


def _checked(d: dict, key: str, default: Any, ok, expected: str, where: str, problems: list[str]) -> Any:
    """d[key] if `ok(value)`; otherwise a problem `{where}: {key} is V (expected {expected})` and the default."""
    present, value = _take(d, key, default, where, problems)
    if present and not ok(value):
        problems.append(f"{where}: {key} is {describe(value)} (expected {expected})")
        return None if default is REQUIRED else default
    return value


def bool_field(d: dict, key: str, default: Any, where: str, problems: list[str]) -> Any:
    """d[key] as a JSON true/false (not 0/1, not a string)."""
    return _checked(d, key, default, lambda v: isinstance(v, bool), "true or false", where, problems)


def choice_field(d: dict, key: str, default: Any, choices: tuple[str, ...], where: str,
                 problems: list[str]) -> Any:
    """d[key] as one of the strings `choices`."""
    return _checked(d, key, default, lambda v: isinstance(v, str) and v in choices,
                    f"one of {', '.join(choices)}", where, problems)


def str_field(d: dict, key: str, default: Any, where: str, problems: list[str]) -> Any:
    """d[key] as a string."""
    return _checked(d, key, default, lambda v: isinstance(v, str), "a string", where, problems)


# ------------------------------------------------------------------------------------------ paths

def path_problem(path: Path | str, need: str) -> str | None:
    """What is wrong with `path` for reading a `need` ("folder", "file", or "file or folder") — "does
    not exist", "is a file, not a folder", "is a named pipe (FIFO), not a regular file", ... — or
    None. Only stat()ed: a FIFO or a device is never opened (reading one blocks or never ends)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "is a broken symbolic link" if os.path.islink(path) else "does not exist"
    except NotADirectoryError:
        return "does not exist (a file stands where a folder on its path should be)"
    except PermissionError:
        return "cannot be read (permission denied on a folder on its path)"
    except (OSError, ValueError) as e:          # a name too long, a NUL byte, a loop of links
        return f"cannot be looked up ({getattr(e, 'strerror', None) or type(e).__name__})"
    if stat.S_ISDIR(mode):
        kind = "folder"
    elif stat.S_ISREG(mode):
        kind = "file"
    else:
        other = ("a named pipe (FIFO)" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode) else
                 "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "a special file")
        return f"is {other}, not a {'regular file' if need != 'folder' else 'folder'}"
    if kind not in need.split(" or "):
        return f"is a {kind}, not a {need}"
    if not os.access(path, os.R_OK | (os.X_OK if kind == "folder" else 0)):
        return "cannot be read (permission denied)"
    return None


# ----------------------------------------------------------------------------------- safetensors

def check_safetensors(path: Path) -> str | None:
    """What is wrong with the safetensors file at `path`, or None if its header is sound (see
    safetensors_header)."""
    return safetensors_header(path)[1]


def safetensors_header(path: Path) -> tuple[dict[str, tuple[tuple[int, ...], str]] | None, str | None]:
    """(key -> (shape, safetensors dtype), None) of the safetensors file at `path` if its header is
    sound, else (None, what is wrong).

    Reads only the 8-byte little-endian header length and the JSON header, and checks what the
    safetensors library itself enforces when it opens a file: a header that fits the file, a JSON
    object whose `__metadata__` maps strings to strings, and tensor entries with a known dtype, a
    shape of non-negative integers and data_offsets that match the shape and tile the data area
    exactly. The problem is a clause for "<file> <clause>", e.g. "is not a safetensors file (...)".
    """
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):        # a FIFO or device is never opened (reading one blocks or never ends)
            return None, path_problem(path, "file") or "is not a regular file"
        size = st.st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return None, f"is not a safetensors file (only {size} bytes)"
            n = int.from_bytes(head, "little")
            if n < 2 or n > min(MAX_HEADER_BYTES, size - 8):
                return None, (f"is not a safetensors file (its first 8 bytes give a header of {n} bytes; "
                              f"the file has {size})")
            raw = f.read(n)
    except OSError as e:
        return None, f"cannot be read ({e.strerror or type(e).__name__})"
    problems: list[str] = []
    header = parse_json_object(raw, "its header", problems)
    if header is None:
        return None, f"is not a safetensors file ({problems[0]})"
    if problem := _check_header(header, size - 8 - n):
        return None, f"has a damaged safetensors header ({problem})"
    return {k: (tuple(v["shape"]), v["dtype"]) for k, v in header.items() if k != "__metadata__"}, None


def _check_header(header: dict, data_size: int) -> str | None:
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        return "__metadata__ is not a map of strings to strings"
    spans = []
    for i, (name, entry) in enumerate((k, v) for k, v in header.items() if k != "__metadata__"):
        label = f"tensor {safe_name(name, f'#{i + 1}')}"
        if not isinstance(entry, dict):
            return f"{label} is {describe(entry)}, not an entry"
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in SAFETENSORS_DTYPE_BITS:
            return f"{label} has dtype {describe(dtype)}, not a safetensors dtype"
        if not isinstance(shape, list) or not all(is_int(s) and s >= 0 for s in shape):
            return f"{label} has shape {describe(shape)}, not a list of non-negative integers"
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(is_int(o) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1] <= data_size):
            return f"{label} has data_offsets {describe(offsets)}, not [begin, end] within the {data_size}-byte data"
        bits = math.prod(shape) * SAFETENSORS_DTYPE_BITS[dtype]
        if bits % 8 or bits // 8 != offsets[1] - offsets[0]:
            return f"{label} holds {offsets[1] - offsets[0]} bytes, not what a {dtype} tensor of shape {shape} needs"
        spans.append((offsets[0], offsets[1], label))
    end = 0
    for begin, stop, label in sorted(spans):
        if begin != end:
            return f"{label} does not start where the previous tensor ends"
        end = stop
    if end != data_size:
        return f"the tensors cover {end} of the file's {data_size} data bytes"
    return None


def damaged(subject: str, problems: list[str], fix: str) -> InputError:
    """The error for a file whose contents are wrong: `{subject} is damaged: <problems>; {fix}`, where
    `subject` names it, e.g. "checkpoint '/renders/a.resume.safetensors'"."""
    if len(problems) == 1:
        return InputError(f"{subject} is damaged: {problems[0]}; {fix}")
    return InputError(f"{subject} is damaged ({len(problems)} problems: {'; '.join(problems)}); {fix}")


def metadata_json(meta: dict[str, str], key: str, problems: list[str]) -> dict | None:
    """The JSON object stored as `meta[key]` in a safetensors file's metadata, or None with a problem
    appended (missing, not JSON, not an object)."""
    if key not in meta:
        problems.append(f"its metadata has no {key!r} entry")
        return None
    return parse_json_object(meta[key], f"its {key!r} metadata", problems)


def read_metadata_json(meta: dict[str, str], key: str, what: str, path: str | Path, fix: str) -> dict:
    """`metadata_json`, or an InputError "{what} {path!r} is damaged: ...; {fix}"."""
    problems: list[str] = []
    value = metadata_json(meta, key, problems)
    if value is None:
        raise damaged(f"{what} {str(path)!r}", problems, fix)
    return value


SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn",
                      "F8_E5M2": "float8_e5m2", "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
                      "BOOL": "bool"}


INTEGER_DTYPES = ("int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", "uint64", "bool",
                  "I64", "I32", "I16", "I8", "U8", "U16", "U32", "U64", "BOOL")
"""Storage dtypes no weight of a Wan transformer, VAE, text or image encoder has: a float model would
load such a tensor as whole numbers (transformers and diffusers cast it without a word)."""
INTEGER_KEPT = ("position_ids",)
"""Integer buffers older transformers checkpoints save (CLIP's position ids): not weights."""


def integer_tensors(header: dict[str, tuple[tuple[int, ...], str]]) -> list[tuple[str, str]]:
    """(key, dtype) of each tensor of a weights header (key -> (shape, dtype)) stored as integers."""
    return [(k, dt) for k, (_, dt) in header.items() if dt in INTEGER_DTYPES and not k.endswith(INTEGER_KEPT)]


def integer_problem(file: Path | str, found: list[tuple[str, str]]) -> str:
    """One line naming the first integer-typed tensors of a float model's weights file."""
    shown = ", ".join(f"{safe_name(k, 'a tensor with an odd name')} ({SAFETENSORS_DTYPES.get(dt, dt)})"
                      for k, dt in found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
    return (f"{file}: {len(found)} tensor(s) stored as integers, not floating point: {shown}; model weights are "
            "float (bfloat16, float16, float32 or float8): replace the file with the original one")
