"""Sound files for the tests of sound under video (test_sound, test_timeline, test_delivery)."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np

RATE = 48000


def make_track(path: Path, seconds: float, *, rate: int = RATE, channels: int = 2, clicks=()) -> Path:
    """A silent 16-bit WAV with a one-sample click (on every channel) at each time in `clicks`."""
    data = np.zeros((round(seconds * rate), channels), np.int16)
    for t in clicks:
        data[round(t * rate)] = 20000
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(data.tobytes())
    return path
