"""The tuned configs shipped with fa2gen: ``tuned_configs/<arch>/<device>.yaml``.

Installed, the folder is the package resource ``fa2gen.tuned_configs``; in a source
checkout used without installing, it is the top-level folder beside ``fa2gen/``.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .yamlfile import ConfigFile

log = logging.getLogger(__name__)


def shipped_root() -> Path | None:
    # tuned_configs/ has an __init__.py, so that installed it is a regular package, for which
    # files() returns a Path (as a namespace package it gave a MultiplexedPath, whose str() is
    # no path, and a wheel install found no configs). Anything else (a zip) is not searched.
    # Importing this module stays stdlib-only (no yaml, no torch): the YAML is read below.
    try:
        from importlib.resources import files

        root = files("fa2gen.tuned_configs")
        if isinstance(root, Path) and root.is_dir():
            return root
    except (ModuleNotFoundError, TypeError):
        pass
    checkout = Path(__file__).resolve().parents[2] / "tuned_configs"
    return checkout if checkout.is_dir() else None


@functools.lru_cache(maxsize=None)
def shipped_files(arch: str, root: Path | None = None) -> tuple[tuple[str, ConfigFile], ...]:
    """(device, file) for every valid YAML file of ``arch``; bad files warn and are skipped."""
    import warnings

    from .records import RecordError
    from .yamlfile import read

    root = root or shipped_root()
    folder = root / arch if root else None
    if folder is None or not folder.is_dir():
        return ()
    found = []
    for path in sorted(folder.glob("*.yaml")):
        try:
            cfg = read(path, lenient=True)  # (one bad entry costs that entry, not the file)
        except RecordError as e:
            warnings.warn(f"fa2gen: ignoring unreadable tuned config {path.name}: {e}", RuntimeWarning, stacklevel=2)
            continue
        if cfg.skipped:
            warnings.warn(
                f"fa2gen: {path.name}: ignoring {len(cfg.skipped)} invalid entries, e.g. {cfg.skipped[0]}",
                RuntimeWarning,
                stacklevel=2,
            )
        if cfg.arch != arch:
            warnings.warn(
                f"fa2gen: ignoring {path.name}: it says arch {cfg.arch}, found under {arch}",
                RuntimeWarning,
                stacklevel=2,
            )
            continue
        found.append((cfg.meta["device"], cfg))
    return tuple(found)
