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
import string
from collections.abc import Iterable, Iterator
from pathlib import Path

from .errors import OutputError

log = logging.getLogger("vidgen")

FRAME_RE = re.compile(r"frame_\d{5,}\.(png|exr)")
"""The files of a frame-sequence output (PNG, EXR); a folder holding anything else is not an earlier render's."""
_TAG_LEN = 14
"""Characters a temporary name adds after `.partial` (`-<pid>-<hex>`), at most."""


# ------------------------------------------------------------------------------- names


def path_text_problem(path: str | os.PathLike) -> str | None:
    """Why `path` can name no file at all (a NUL byte, text the filesystem cannot encode, nothing),
    as a clause; None when it can. Checked before anything else, so no OS call ever sees it."""
    text = os.fspath(path)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if not text.strip():
        return "is empty; give a file path such as outputs/clip.mp4"
    if "\x00" in text:
        return "holds a NUL character, which no file name can hold; remove it"
    try:
        os.fsencode(text)
    except UnicodeEncodeError:
        return "holds characters this filesystem cannot encode (a lone surrogate); remove them"
    return None


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


def latents_path(output: Path) -> Path:
    """A render's sampled latents: out.mp4 -> out.latents.safetensors (out.mkv and out share it)."""
    return output.with_name(output.stem + ".latents.safetensors")


def resume_path(output: Path) -> Path:
    """A render's sampler checkpoint: out.mp4 -> out.resume.safetensors."""
    return output.with_name(output.stem + ".resume.safetensors")


C2PA_SIDECAR_TYPES = (".mkv", ".webm", ".mxf")
"""Outputs whose signed content credentials go in a sidecar NAME.c2pa (c2pa-rs cannot embed a manifest in
them; vidgen.provenance), one of the render's files wherever provenance signs it."""


def derived_paths(video: str | os.PathLike, keep_frames: Iterable[int] = ()) -> dict[str, Path]:
    """Every file a render to `video` writes, by role: video, sidecar, latents, resume, preview,
    frame-K for each kept frame index K (output.keep_frames, already taken modulo the clip length), and
    for .mkv/.webm/.mxf c2pa (the signed manifest's sidecar, when provenance signs).

    The one list of a render's names: preflight checks them all, a numbered name must find them
    all free, and they move together (OutputSet). The queue's submit checks them too.
    """
    video = Path(video)
    out = {"video": video, "sidecar": sidecar_path(video), "latents": latents_path(video),
           "resume": resume_path(video), "preview": preview_path(video)}
    out.update({f"frame-{k}": kept_frame_path(video, k) for k in sorted(set(keep_frames))})
    if video.suffix.lower() in C2PA_SIDECAR_TYPES:
        out["c2pa"] = video.with_suffix(".c2pa")
    return out


def has_placeholders(template: str) -> bool:
    """Whether an output.path template has a {field} to fill in; `{{` and `}}` are literal braces.

    A template is a naming scheme, not a file: its outputs are numbered (`numbered`). A malformed
    template (a lone brace) counts as having them: it cannot name one file (the config checks report it).
    """
    try:
        return any(name is not None for _, name, _, _ in string.Formatter().parse(template))
    except ValueError:
        return True


def alternatives(video: Path):
    """`video`, then NAME-2.EXT, NAME-3.EXT, ... (998 of them)."""
    yield video
    for n in range(2, 1000):
        yield video.with_name(f"{video.stem}-{n}{video.suffix}")


def _taken(video: Path, keep_frames: Iterable[int], own: Iterable[Path] = ()) -> list[Path]:
    mine = {Path(os.path.abspath(p)) for p in own}
    return [p for p in derived_paths(video, keep_frames).values()
            if os.path.lexists(p) and Path(os.path.abspath(p)) not in mine]


def free_names(video: Path, keep_frames: Iterable[int] = (), own: Iterable[Path] = ()) -> Iterator[Path]:
    """Those of `alternatives(video)` whose every derived file is free (`own`: not in the way), in order."""
    keep_frames, own = tuple(keep_frames), tuple(own)
    return (c for c in alternatives(video) if not _taken(c, keep_frames, own))


def numbered(video: str | os.PathLike, keep_frames: Iterable[int] = (), own: Iterable[Path] = ()) -> Path:
    """The first of `alternatives(video)` whose every derived file (derived_paths) is free: the name a
    render from an output.path template takes, so a re-run never collides with an earlier one.
    `own`: files that belong to this render, not in the way. OutputError if 999 names are taken."""
    video = Path(video)
    if (candidate := next(free_names(video, keep_frames, own), None)) is not None:
        return candidate
    raise OutputError(f"output.path: {video} and 998 numbered names beside it are taken; clear the folder or "
                      "give another output.path")


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
    now, at the moment of writing) and `path` itself is not a link. No root: no rule. A path that
    can name no file (path_text_problem) is refused always."""
    if why := path_text_problem(path):
        raise OutputError(f"{str(path)!r} {why}")
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
                "folder of frame_NNNNN.png/.exr files: choose another path")
    return None


_WHAT = {"latents": " (the sampled latents of an earlier render: `vidgen decode {}` finishes it)",
         "resume": " (an interrupted render's checkpoint: `vidgen render CONFIG --resume` continues it)"}


def check_render_files(video: Path, *, keep_frames: Iterable[int] = (), overwrite: bool = False,
                       root: str | os.PathLike | None = None, folder: bool = False, own: Iterable[Path] = (),
                       overwrite_hint: str = "set output.overwrite=true") -> list[str]:
    """Every problem with the files a render to `video` writes (derived_paths, less the preview,
    which a render replaces as it goes), checked as one; creates nothing.

    Files that exist are one problem, naming the first (the video, else its latents, checkpoint,
    sidecar, kept frames) and the two ways out; then check_targets' rules (names that fit, inside
    `root`, writable folders, a PNG-frame folder when `folder`). `own`: files that belong to this
    render (the checkpoint it resumes, the latents it decodes): not in the way.
    """
    if why := path_text_problem(video):
        return [f"output.path: {str(video)!r} {why}"]
    mine = {Path(os.path.abspath(p)) for p in own}
    paths = derived_paths(video, keep_frames)
    del paths["preview"]
    targets = [(role, p) for role, p in paths.items() if Path(os.path.abspath(p)) not in mine]
    problems = []
    existing = [(role, p) for role, p in targets if os.path.lexists(p)]
    if existing and not overwrite:
        role, first = existing[0]
        more = f" (with {len(existing) - 1} file{'s' if len(existing) > 2 else ''} beside it)" if len(existing) > 1 else ""
        problems.append(f"output.path: {str(first)!r} already exists{_WHAT.get(role, '').format(first)}{more}; "
                        f"give another output.path, or {overwrite_hint}")
        targets = [t for t in targets if t not in existing]
    return problems + check_targets([("output.path", p) for _, p in targets], overwrite=overwrite, root=root,
                                    folder_outputs=[video] if folder else [], overwrite_hint=overwrite_hint)


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
    if bad := [(key, path, why) for key, path in targets if (why := path_text_problem(path))]:
        return [f"{key}: {str(path)!r} {why}" for key, path, why in bad[:1]]     # every other check would fail on it
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
    for candidate in alternatives(final):
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


class OutputSet:
    """The files of one render (derived_paths of its video), claimed and moved as one.

    Each file is written to a temporary and put in place with `put`, which never replaces a file
    this render did not put there: when a name is taken by someone else (a second render to the
    same path), every file this render has put so far moves to the next numbered name whose files
    are all free, and the rest follow there. So a render's video, sidecar, latents and checkpoint
    always share one name, and never another render's.

    `numbered` (the output came from a template): moving is what the name is for, and is logged. A
    literal path a user gave: the files are kept under the new name and putting the video raises
    OutputError saying where. With `overwrite` every file is replaced in place, as asked. `own`:
    files already there that belong to this render (the checkpoint it resumes, the latents it decodes).
    """

    def __init__(self, video: str | os.PathLike, *, overwrite: bool = False, root: str | os.PathLike | None = None,
                 numbered: bool = False, keep_frames: Iterable[int] = (), own: Iterable[Path] = ()):
        self.requested = self.video = Path(video)
        self.overwrite, self.root, self.numbered = overwrite, root, numbered
        self.keep_frames = tuple(keep_frames)
        self._mine: dict[str, tuple[Path, tuple[int, int]]] = {}   # role -> where this render's file is, its identity
        owned = {Path(os.path.abspath(p)) for p in own}
        for role, path in self.paths().items():
            if Path(os.path.abspath(path)) in owned and (ident := _identity(path)):
                self._mine[role] = path, ident

    def paths(self, video: Path | None = None) -> dict[str, Path]:
        return derived_paths(self.video if video is None else video, self.keep_frames)

    def path(self, role: str) -> Path:
        """Where `role`'s file is (or goes) now."""
        return self.paths()[role]

    def mine(self, role: str) -> bool:
        """Whether the file at `role`'s name is the one this render put there."""
        return role in self._mine and self._mine[role][0] == self.path(role) and self._held(role)

    def _held(self, role: str) -> bool:
        where, ident = self._mine[role]
        return _identity(where) == ident

    def put(self, role: str, tmp: Path) -> Path:
        """Move the finished temporary `tmp` to `role`'s name; returns where it went."""
        while True:
            final = self.path(role)
            confine(final, self.root)
            if self.overwrite or self.mine(role):
                _replace(tmp, final)
                break
            try:
                rename_noreplace(tmp, final)
                break
            except FileExistsError:
                self._move()
        self._mine[role] = final, _identity(final)
        if role == "video" and self.video != self.requested and not self.numbered:
            raise OutputError(f"{self.requested} appeared while this ran (another render or program wrote it) and "
                              f"was left alone; this result is kept as {self.video}")
        return final

    def remove(self, role: str) -> None:
        """Delete `role`'s file if this render put it there (and nothing else)."""
        if self.mine(role):
            discard(self.path(role))
        self._mine.pop(role, None)

    def _move(self) -> None:
        """Move every file this render has put to the next numbered name whose files are all free."""
        for candidate in free_names(self.requested, self.keep_frames):
            if candidate == self.video:
                continue
            there = self.paths(candidate)
            try:
                for role in [r for r in self._mine if self._held(r)]:
                    where, ident = self._mine[role]
                    confine(there[role], self.root)
                    rename_noreplace(where, there[role])
                    self._mine[role] = there[role], ident
            except FileExistsError:         # taken meanwhile: try the next, from where each file is now
                continue
            log.info("output.path: %s is taken (another render wrote there meanwhile); this render writes %s",
                     self.video, candidate)
            self.video = candidate
            return
        raise OutputError(f"{self.requested} and 998 numbered names beside it are taken; this render's files are "
                          f"left at {self.video}")


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


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
    for p in folder.glob("frame_*"):
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
