"""Helpers for the hostile-input suites (tests/test_hostile*.py): what a refused input must leave behind.

Every refused case must end with exit code 2 (3 for the guard), one `vidgen: error:` line on
stderr, no traceback, and no file created, changed or deleted under the folders the test watches.
`VIDGEN_HOSTILE_LOG=FILE python -m pytest tests/test_hostile*.py` appends each refusal (test, line) to FILE.
"""

from __future__ import annotations

import hashlib
import os
from contextlib import contextmanager
from pathlib import Path


def snapshot(*roots: Path) -> dict[str, str]:
    """Every file, folder and link under `roots` with a hash of its content (or link target)."""
    out: dict[str, str] = {}
    for root in roots:
        root = Path(root)
        if not os.path.lexists(root):
            continue
        if root.is_file() and not root.is_symlink():
            out[str(root)] = hashlib.sha256(root.read_bytes()).hexdigest()
            continue
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            for name in dirnames + filenames:
                path = Path(dirpath) / name
                if path.is_symlink():
                    out[str(path)] = "link:" + os.readlink(path)
                elif path.is_dir():
                    out[str(path)] = "dir"
                else:
                    out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def diff(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """What changed between two snapshots, as readable lines ('' if nothing)."""
    created = sorted(set(after) - set(before))
    deleted = sorted(set(before) - set(after))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    return [f"created {p}" for p in created] + [f"deleted {p}" for p in deleted] + [f"changed {p}" for p in changed]


@contextmanager
def untouched(*roots: Path):
    """Assert that nothing under `roots` is created, changed or deleted inside the block."""
    before = snapshot(*roots)
    yield
    changes = diff(before, snapshot(*roots))
    assert not changes, "files changed by a refused input:\n" + "\n".join(changes)


def assert_refused(code: int, err: str, *needles: str, exit_code: int = 2) -> str:
    """Exit `exit_code`, one `vidgen: error:` line, no traceback, every needle in it; returns the line."""
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("vidgen: ") or
             line.startswith("vidgen: error:")]
    errors = [line for line in err.splitlines() if line.startswith("vidgen: error:")]
    assert code == exit_code, f"exit {code}, expected {exit_code}:\n{err}"
    assert "Traceback" not in err, err
    assert "internal error" not in err, err
    assert len(errors) == 1, err
    stray = [line for line in lines if not line.startswith("vidgen: error:")]
    assert not stray, f"lines besides the error: {stray}"
    for needle in needles:
        assert needle in errors[0], f"{needle!r} not in: {errors[0]}"
    if log := os.environ.get("VIDGEN_HOSTILE_LOG"):   # collect every refusal's message, e.g. for a review
        with open(log, "a") as f:
            f.write(f"{os.environ.get('PYTEST_CURRENT_TEST', '?').split(' ')[0]}\t{errors[0]}\n")
    return errors[0]
