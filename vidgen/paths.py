"""Where vidgen may write: the one place that checks every path a render or job will write.

Three rules, for the video, the latents, the resume checkpoint, the sidecar, stitched films and
contact sheets alike:

- nothing a user made is replaced: a path that exists is refused up front unless the config says
  overwrite, and the final rename is a no-replace rename, so a file that appeared meanwhile (a
  second render to the same path) is never clobbered — the new result is kept under another name
  and the caller is told;
- a write stays inside its root (a workflow's output_dir): the real parent folder is resolved at
  the moment of writing, so a symbolic link made after the job was submitted cannot redirect it;
- every derived name (hidden temporaries included) fits the filesystem's name limit, checked
  before any work is done, so a long name never fails after minutes of sampling.

Overwriting a folder of PNG frames is allowed only when it holds nothing but frames.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import os
import re
import secrets
from collections.abc import Iterable
from pathlib import Path

from .errors import OutputError

log = logging.getLogger("vidgen")

FRAME_RE = re.compile(r"frame_\d{5,}\.png")
"""The files of a PNG-frame output; a folder holding anything else is not an earlier render's."""
_TAG_LEN = 14
"""Characters a temporary name adds after `.partial` (`-<pid>-<hex>`), at most."""


# ------------------------------------------------------------------------------- names


def partial_path(final: Path) -> Path:
    """A temporary name next to `final` (same filesystem, so the rename is atomic), hidden by the
    dot and unique to this process, so two renders to one path never share (or delete) a temporary."""
    tag = f"{os.getpid() % 10**6}-{secrets.token_hex(3)}"
    return final.parent / f".{final.stem}.partial-{tag}{final.suffix}"


def _longest_partial(final: Path) -> str:
    return f".{final.stem}.partial-{'x' * _TAG_LEN}{final.suffix}"


def kept_frame_path(path: Path, index: int) -> Path:
    """A frame kept losslessly beside an output (output.keep_frames): out.mp4 -> out.mp4.frame-80.png."""
    return Path(f"{path}.frame-{index}.png")


def preview_path(path: Path) -> Path:
    """A running render's latest preview image, beside its output: out.mp4 -> out.mp4.preview.png."""
    return Path(f"{path}.preview.png")


def sidecar_path(path: Path) -> Path:
    """The JSON sidecar of an output: out.mp4 -> out.mp4.json, a frames folder F -> F.json."""
    return Path(f"{path}.json")


def _existing_ancestor(path: Path) -> Path:
    for parent in path.parents:
        if parent.exists():
            return parent
    return Path(path.anchor or ".")


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255


def name_excess(path: Path) -> tuple[int, int] | None:
    """(bytes needed, bytes allowed) when `path`'s name, or a temporary beside it, does not fit its
    filesystem's name limit; None when it fits."""
    limit = _name_max(_existing_ancestor(path))
    need = max(len(os.fsencode(n)) for n in (path.name, _longest_partial(path), *path.parent.parts[-1:]))
    return (need, limit) if need > limit else None


def name_problem(path: Path) -> str | None:
    """Why `path` (or a temporary beside it) cannot be created on its filesystem: a name too long."""
    excess = name_excess(path)
    return None if excess is None else _too_long(path, *excess)


def _too_long(path: Path, need: int, limit: int) -> str:
    return (f"{path.name[:40]!r}... is too long: with the files vidgen writes beside it and their hidden "
            f"temporaries, names reach {need} bytes and this filesystem allows {limit}; shorten it by "
            f"{need - limit} bytes")


# ------------------------------------------------------------------------------- roots


def confine(path: Path, root: str | os.PathLike | None) -> None:
    """Raise OutputError unless `path`'s real folder is inside `root`'s real path (links resolved
    now, at the moment of writing) and `path` itself is not a link. No root: no rule."""
    if root is None:
        return
    # realpath resolves every link along the part that exists and keeps the rest as written
    real_root, real = Path(os.path.realpath(root)), Path(os.path.realpath(path.parent))
    if not real.is_relative_to(real_root):
        raise OutputError(f"{path} would be written outside {root} (its folder leads to {real} through a "
                          "symbolic link); outputs stay inside their folder: remove the link")
    if path.is_symlink():
        raise OutputError(f"{path} is a symbolic link; outputs are never written through links: remove it")


def ensure_folder(path: Path, root: str | os.PathLike | None = None) -> None:
    """Create `path`'s parent folder (and its parents) for a write happening now, inside `root`."""
    confine(path, root)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"cannot create the folder {path.parent} ({e.strerror or e})") from None
    confine(path, root)


# ------------------------------------------------------------------------------- up-front checks


def frames_folder_problem(path: Path) -> str | None:
    """Why an existing folder may not be overwritten as a PNG-frame output (None when it may)."""
    if path.is_symlink() or not path.is_dir():
        return f"{str(path)!r} exists and is not a folder of frames; choose another path"
    others = sorted(p.name for p in path.iterdir() if not (FRAME_RE.fullmatch(p.name) and p.is_file()))
    if others:
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        return (f"{str(path)!r} holds more than an earlier render's frames ({shown}); overwrite replaces only a "
                "folder of frame_NNNNN.png files: choose another path")
    return None


def check_targets(targets: Iterable[tuple[str, Path]], *, overwrite: bool, root: str | os.PathLike | None = None,
                  folder_outputs: Iterable[Path] = (), overwrite_hint: str = "set output.overwrite=true") -> list[str]:
    """Every problem with writing `targets` ((config key, path) pairs), as sentences; creates nothing.

    A target that exists is refused unless `overwrite` (a PNG-frame folder in `folder_outputs`
    only if it holds nothing but frames); a name too long, a folder outside `root`, or a folder that
    cannot be written are refused always.
    """
    problems: list[str] = []
    folders = {Path(p) for p in folder_outputs}
    checked_dirs: set[Path] = set()
    targets = [(key, Path(path)) for key, path in targets]
    worst = max(((e, key) for key, path in targets if (e := name_excess(path))), default=None)
    if worst is not None:       # one message: shortening the first name shortens every name derived from it
        (need, limit), key = worst
        first = next(path for k, path in targets if k == key)
        problems.append(f"{key}: {_too_long(first, need, limit)}")
        targets = []
    for key, path in targets:
        if root is not None:
            try:
                confine(path, root)
            except OutputError as e:
                problems.append(f"{key}: {e}")
                continue
        if os.path.lexists(path):
            if not overwrite:
                problems.append(f"{key}: {str(path)!r} already exists; vidgen never replaces a file it did not "
                                f"just write: choose another path, move it away, or {overwrite_hint}")
            elif path in folders and (why := frames_folder_problem(path)):
                problems.append(f"{key}: {why}")
            elif path not in folders and path.is_dir() and not path.is_symlink():
                problems.append(f"{key}: {str(path)!r} is a folder; overwrite replaces files only: choose another path")
        folder = _existing_ancestor(path)
        if folder in checked_dirs:
            continue
        checked_dirs.add(folder)
        if not folder.is_dir():
            problems.append(f"{key}: cannot write in {str(folder)!r}: it is a file, not a folder; choose another "
                            "output folder")
        elif not os.access(folder, os.W_OK | os.X_OK):
            problems.append(f"{key}: cannot write in {str(folder)!r} (permission denied); choose a writable folder")
    return problems


# ------------------------------------------------------------------------------- the final step


_AT_FDCWD, _RENAME_NOREPLACE = -100, 1


@functools.cache
def _libc_renameat2():
    """libc's renameat2, looked up once; None where the C library has none (macOS, old glibc)."""
    try:
        return ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None


def _renameat2(src: Path, dst: Path) -> bool:
    """Linux renameat2(RENAME_NOREPLACE); False when the system or filesystem lacks it."""
    fn = _libc_renameat2()
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(dst))


def rename_noreplace(src: Path, dst: Path) -> None:
    """Rename `src` to `dst`, failing with FileExistsError if `dst` exists (checked atomically)."""
    if _renameat2(src, dst):
        return
    if src.is_dir():            # no atomic no-replace rename for folders here: claim, then check
        if os.path.lexists(dst):
            raise FileExistsError(errno.EEXIST, "exists", str(dst))
        os.rename(src, dst)
        return
    os.link(src, dst)           # fails if dst exists; the name then points at the finished file
    os.unlink(src)


def _alternatives(final: Path):
    yield final
    for n in range(2, 1000):
        yield final.with_name(f"{final.stem}-{n}{final.suffix}")


def publish(tmp: Path, final: Path, *, overwrite: bool = False, sidecar_tmp: Path | None = None,
            root: str | os.PathLike | None = None) -> Path:
    """Move a finished temporary (file or PNG folder), and its sidecar, to `final`; returns `final`.

    Without `overwrite` the rename never replaces anything: if `final` (or its sidecar) appeared
    since the up-front check, the result is kept under the first free `NAME-N.EXT` and an
    OutputError says where, so both files survive. With `overwrite` an existing file is replaced
    atomically, and an existing folder only if it holds nothing but frames.
    """
    confine(final, root)
    if overwrite:
        if sidecar_tmp is not None:
            os.replace(sidecar_tmp, sidecar_path(final))
        _replace(tmp, final)
        return final
    for candidate in _alternatives(final):
        side = sidecar_path(candidate)
        if sidecar_tmp is not None:
            try:
                rename_noreplace(sidecar_tmp, side)
            except FileExistsError:
                continue
        try:
            rename_noreplace(tmp, candidate)
        except FileExistsError:
            if sidecar_tmp is not None:
                os.rename(side, sidecar_tmp)        # ours: take it back and try the next name
            continue
        if candidate != final:
            raise OutputError(f"{final} appeared while this ran (another render or program wrote it) and was left "
                              f"alone; this result is kept as {candidate}")
        return final
    raise OutputError(f"{final} and 998 alternative names are taken; this result is left at {tmp}")


def _replace(tmp: Path, final: Path) -> None:
    if not tmp.is_dir():
        os.replace(tmp, final)
        return
    if not os.path.lexists(final):
        os.rename(tmp, final)
        return
    if why := frames_folder_problem(final):     # checked again now: the folder may have changed
        raise OutputError(f"output.path: {why}")
    old = final.parent / f".{final.name}.old-{secrets.token_hex(3)}"
    os.rename(final, old)
    os.rename(tmp, final)
    remove_frames(old)


def remove_frames(folder: Path) -> None:
    """Delete a PNG-frame folder vidgen wrote (its frame files, then the folder if that left it empty)."""
    for p in folder.glob("frame_*.png"):
        if FRAME_RE.fullmatch(p.name):
            p.unlink(missing_ok=True)
    try:
        folder.rmdir()
    except OSError:
        log.warning("left %s in place: it holds files vidgen did not write", folder)


def discard(path: Path) -> None:
    """Remove a temporary this process created (a file, or a folder of frames); never raises."""
    try:
        if path.is_dir() and not path.is_symlink():
            remove_frames(path)
        else:
            path.unlink(missing_ok=True)
    except OSError:
        pass
