"""Memory budgets: parsed once from the config's text, measured free memory, and sizes as people read them.

`parse_budget` turns a budget setting ("auto", bytes, "1.5GiB", "800MB") into "auto" or bytes;
`free_memory` measures what a device has free now; `format_bytes` writes a size back. This module
imports nothing of vidgen but `errors` (config.py parses its budgets with it), and torch only when
memory is measured.
"""

from __future__ import annotations

import math
import os
import re
from typing import Literal, Union

from .errors import ConfigError

Budget = Union[int, Literal["auto"]]
"""A budget once parsed: bytes, or "auto" (measured from free memory when it is planned)."""

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_budget(value, key: str = "vae.memory_budget") -> Budget | None:
    """A memory budget's value: None | "auto" | bytes (int) | "1.5GiB" / "800MB" / "2e9" -> None, "auto" or
    bytes. `key` names the setting in errors."""
    if value is None or value == "auto":
        return value
    if isinstance(value, bool):
        raise ConfigError(f"{key}: {value!r} is not a size; use bytes, '1.5GiB' or 'auto'")
    if isinstance(value, (int, float)):
        if value <= 0 or not math.isfinite(value):
            raise ConfigError(f"{key}: {value!r} must be a positive size")
        return int(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgt]i?b?|b)?\s*", str(value).lower())
    if not m:
        raise ConfigError(f"{key}: {value!r} is not a size; write e.g. 1.5GiB, 800MB, 2000000000 or auto")
    unit = m.group(2) or ""
    if unit and not unit.endswith("b"):
        unit += "b"
    return parse_budget(float(m.group(1)) * _UNITS[unit], key)


def free_memory(device) -> int:
    """Bytes free on `device` now (a torch.device): CUDA's free memory, what MPS recommends less what it
    holds, or the host's available RAM."""
    import torch

    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free
    if device.type == "mps":
        return int(torch.mps.recommended_max_memory() - torch.mps.driver_allocated_memory())
    try:
        import psutil

        return psutil.virtual_memory().available
    except ImportError:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def format_bytes(n: float, up: bool = False) -> str:
    """n bytes in GiB or MiB; `up`: rounded up in the last digit shown, so a budget written as the
    text is never below n (an error that names a minimum names a budget that is accepted)."""
    rnd = math.ceil if up else round
    if n >= 2**30:
        return f"{rnd(n / 2**30 * 100) / 100:.2f} GiB"
    if n >= 10 * 2**20:
        return f"{rnd(n / 2**20):.0f} MiB"
    if n >= 2**20:
        return f"{rnd(n / 2**20 * 100) / 100:.2f} MiB"
    return f"{rnd(n / 2**10):.0f} KiB"
