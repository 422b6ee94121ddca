"""What an SQLite error of the ledger file itself means for the user, and what to do about it.

Errors of the file (not a database, damaged, read-only, unopenable, disk full) become one-line
InputErrors in the ledger; any other SQLite error is a bug in vidgen's own SQL and stays one.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

ELSEWHERE = "give another --db or VIDGEN_QUEUE"
DAMAGED = f"it is left as it is: move it aside to start a new ledger there, or {ELSEWHERE}"
_NO_ACCESS = f"it must be a file this user can write, in a folder this user can write: fix that, or {ELSEWHERE}"
_NO_DISK = f"check the disk (free space, errors), or {ELSEWHERE}"
# SQLite's primary result codes that mean the ledger file itself cannot be used, each with a part of
# SQLite's message for it (Python 3.10 has no sqlite_errorcode) and what to do. Any other error is a bug.
_FILE_ERRORS = {
    3: ("access permission denied", _NO_ACCESS),        # SQLITE_PERM
    8: ("readonly database", _NO_ACCESS),               # SQLITE_READONLY
    10: ("disk I/O error", _NO_DISK),                   # SQLITE_IOERR
    11: ("malformed", DAMAGED),                        # SQLITE_CORRUPT
    13: ("database or disk is full", _NO_DISK),         # SQLITE_FULL
    14: ("unable to open database file", _NO_ACCESS),   # SQLITE_CANTOPEN
    26: ("file is not a database", DAMAGED),           # SQLITE_NOTADB
}


def file_error_fix(error: sqlite3.DatabaseError) -> str | None:
    """What to do about an error of the ledger file itself; None for any other error."""
    code = getattr(error, "sqlite_errorcode", None)     # an extended code keeps the primary in its low byte
    for primary, (text, fix) in _FILE_ERRORS.items():
        if ((code & 0xFF) == primary) if code is not None else (text in str(error)):
            return fix
    return None


# Filesystems (as /proc/mounts names them) whose locks and shared memory do not span hosts.
NETWORK_FS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "fuse.sshfs", "afs", "ceph", "glusterfs", "lustre", "gpfs"}


def filesystem(path: Path) -> str | None:
    """The type of the filesystem holding `path` (its longest mount point); None where unknown."""
    try:
        mounts = [line.split()[1:3] for line in Path("/proc/self/mounts").read_text().splitlines()]
    except OSError:
        return None
    target = str(path.resolve()).rstrip("/") + "/"
    inside = [(len(mnt), kind) for mnt, kind in mounts if target.startswith(mnt.rstrip("/") + "/")]
    return max(inside)[1] if inside else None
