"""How many threads torch's CPU ops use for a render, when the user has not said (OMP_NUM_THREADS).

torch's default is one thread per core, and every op waits at a barrier for all of them. A small
clip's ops take microseconds, so each wait for a thread that another process holds the core from
costs more than the op: on a busy 2-core machine the demo's denoise ran 0.2 s with one thread and
7.4 s with two (decode 0.4 s and 10.5 s; 256x256: 1.1 s / 11 s and 5 s / 47 s). So a CPU render
gets one thread per PIXELS_PER_THREAD of output (width x height x frames), no more than the cores
this process may use (os.sched_getaffinity).

The count depends on the clip and the machine only, never on the load at the moment: torch's full
reductions are summed in another order with another thread count, so a count taken from the load
average would let one command with one seed give different bits from run to run. On a busy machine
OMP_NUM_THREADS (or MKL_NUM_THREADS) chooses, and is always kept. The CLI's render and the queue
worker ask here; the Python API leaves torch's setting alone.
"""

from __future__ import annotations

import os

PIXELS_PER_THREAD = 1 << 20
"""Output pixels (width x height x frames) per thread, rounded down: a 256x256 clip of 17 frames
(1.1 Mi) gets one, 480p at 81 frames (31 Mi) every core."""

USER_SETTINGS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask; a container's CPU set)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):     # macOS, Windows
        return os.cpu_count() or 1


def cpu_threads(width: int, height: int, num_frames: int) -> tuple[int, str] | None:
    """(threads, why) for a CPU render of this size, or None when the user chose (USER_SETTINGS)."""
    if any(os.environ.get(name) for name in USER_SETTINGS):
        return None
    cores = usable_cores()
    n = min(cores, max(1, width * height * num_frames // PIXELS_PER_THREAD))
    return n, "every core" if n == cores else "a small clip"


def set_cpu_threads(cfg, *, log=None) -> int | None:
    """Set torch's thread count for a render of `cfg` if it renders on the CPU and the user has not
    chosen; returns the count set, or None (also for a device that cannot be had: the render itself
    then says what is wrong with it)."""
    import torch

    from .errors import VidgenError
    from .loading import resolve_device

    try:
        device = resolve_device(cfg.model.device)
    except VidgenError:
        return None
    if device.type != "cpu" or (chosen := cpu_threads(cfg.width, cfg.height, cfg.num_frames)) is None:
        return None
    n, why = chosen
    if n != torch.get_num_threads():
        torch.set_num_threads(n)
        if log is not None:
            log.info("CPU render: %d torch thread%s of %d cores (%s); OMP_NUM_THREADS=N chooses", n,
                     "" if n == 1 else "s", usable_cores(), why)
    return n
