"""A small least-recently-used cache (a leaf: imports nothing of vidgen)."""

from __future__ import annotations

from collections import OrderedDict


class Memo(OrderedDict):
    """A small cache a Pipeline owns and its renders share (decode plans, the guard's loaded
    classifier backend, LoRA files' SHA-256): at most `size` entries, the least recently used dropped first."""

    def __init__(self, size: int = 16):
        super().__init__()
        self.size = size

    def __getitem__(self, key):
        value = super().__getitem__(key)
        self.move_to_end(key)
        return value

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)
