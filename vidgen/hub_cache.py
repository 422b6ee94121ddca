"""The local Hugging Face hub cache, read only: where it is and which model repos it holds (vidgen
never downloads; vidgen.sources finds model.path repo ids and tokenizers in it, `vidgen models` lists it)."""

from __future__ import annotations

import os
from pathlib import Path


def hub_cache() -> Path:
    """The local Hugging Face hub cache (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "huggingface"
    return Path(home).expanduser() / "hub"


def cached_repos() -> list[tuple[str, Path]]:
    """(repo id, newest snapshot folder) of every model repo in the local Hugging Face cache."""
    from huggingface_hub import scan_cache_dir

    if not hub_cache().is_dir():
        return []
    try:
        info = scan_cache_dir(hub_cache())
    except Exception:  # noqa: BLE001 - an unreadable cache lists nothing
        return []
    out = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type == "model" and repo.revisions:
            newest = max(repo.revisions, key=lambda r: r.last_modified)
            out.append((repo.repo_id, Path(newest.snapshot_path)))
    return out
