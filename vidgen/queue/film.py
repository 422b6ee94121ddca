"""A stitched film's frame arithmetic: where each shot lands in it, with joins, fuses and crossfades.

Shared by the stitch that writes the film (vidgen.queue.steps), the workflow's checks that know its
length before any shot renders (vidgen.queue.stitching) and the editorial timeline (vidgen.queue.timeline).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Piece:
    """Where one input of a stitch lands in the film (the stitch's frame arithmetic, `layout`)."""

    frames: int
    skip: int
    """Its first frames, dropped: the clip before shows them (a join)."""
    fade_in: int
    """Frames from its frame `skip` on blended with the clip before's last ones (crossfade or fuse)."""
    fade_out: int
    """Its last frames blended with the next clip's first."""
    start: int
    """The film frame its frame `skip` lands on."""


def layout(frames: list[int], joins: list[int], blends: list[int], crossfade: int) -> list[Piece]:
    """Each input's place in the film: the film has sum(frames) - sum(joins) - sum(fades) frames,
    where an input's fade is its blend (continuity.fuse), else 0 after a join, else the crossfade."""
    fades = [0] + [b or (0 if j else crossfade) for j, b in zip(joins[1:], blends[1:])]    # frames blended at each start
    pieces, at = [], 0
    for n, count in enumerate(frames):
        out = fades[n + 1] if n + 1 < len(frames) else 0
        pieces.append(Piece(count, joins[n], fades[n], out, at))
        at += count - joins[n] - out      # the next input starts blending where this one's fade-out starts
    return pieces


def film_frames(pieces: list[Piece]) -> int:
    return pieces[-1].start + pieces[-1].frames - pieces[-1].skip if pieces else 0


def joined_by(joins: list[int], blends: list[int], crossfade: int) -> list[str]:
    """How each input meets the one before: "" (the first), "cut", "join" (shared frames dropped),
    "crossfade" or "fuse" (shared frames blended)."""
    return [""] + ["fuse" if b else "join" if j else "crossfade" if crossfade else "cut"
                   for j, b in zip(joins[1:], blends[1:])]
