"""Where fa2gen keeps its per-user files."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fa2gen"


def kernel_cache_dir() -> Path:
    """Rendered kernel modules; ``FA2GEN_CACHE_DIR`` overrides."""
    override = os.environ.get("FA2GEN_CACHE_DIR")
    return Path(override) if override else user_cache_root() / "kernels"
