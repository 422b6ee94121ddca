"""A small least-recently-used cache, and the frozen keys caches are keyed by (a leaf: imports nothing of vidgen)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any


class Memo(OrderedDict):
    """A small cache a Pipeline owns and its renders share (decode plans, the guard's loaded
    classifier backend, LoRA files' SHA-256): at most `size` entries, the least recently used dropped first.

    Its `part`s are caches of their own for the planners (simulated decode peaks, model footprints):
    many small entries, kept apart so they never push the render's out. A `vidgen plan` run or a
    decode without a pipeline makes a Memo for itself."""

    def __init__(self, size: int = 16):
        super().__init__()
        self.size = size
        self.parts: dict[str, Memo] = {}

    def __getitem__(self, key):
        value = super().__getitem__(key)
        self.move_to_end(key)
        return value

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)

    def part(self, name: str, size: int) -> Memo:
        """The cache `name` within this one (made at `size` entries when first asked for)."""
        if name not in self.parts:
            self.parts[name] = Memo(size)
        return self.parts[name]

    def cached(self, key, make: Callable[[], Any]):
        """The value kept under `key`, made by `make()` when absent."""
        if key not in self:
            self[key] = make()
        return self[key]


class Frozen(Mapping):
    """A config (a dict of JSON values) frozen and hashable, what caches key on; `_`-prefixed
    metadata (_class_name, _diffusers_version, _name_or_path) left out. Lists freeze to tuples,
    nested dicts to Frozen; `thaw` gives the dict back as JSON would."""

    __slots__ = ("_items", "_dict", "_hash")

    def __init__(self, conf: Mapping):
        items = tuple(sorted((k, _freeze(v)) for k, v in conf.items() if not str(k).startswith("_")))
        self._items, self._dict, self._hash = items, dict(items), hash(items)

    def __getitem__(self, key):
        return self._dict[key]

    def __iter__(self):
        return iter(self._dict)

    def __len__(self) -> int:
        return len(self._dict)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return isinstance(other, Frozen) and self._items == other._items

    def __repr__(self) -> str:
        return f"Frozen({self.thaw()!r})"

    def thaw(self) -> dict:
        """A fresh dict of the config (tuples as lists, as read from JSON)."""
        return {k: _thaw(v) for k, v in self._items}


def _freeze(value):
    if isinstance(value, Mapping):
        return Frozen(value)
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    try:
        hash(value)
    except TypeError:
        return str(value)
    return value


def _thaw(value):
    if isinstance(value, Frozen):
        return value.thaw()
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value
