"""Content-addressed cache of rendered kernel modules, imported by path.

A variant's file name is its mechanical name (which embeds its digest), so a file
that exists under that name was rendered from the same spec, params, template and
Triton version. Files are written atomically so concurrent processes never import
a half-written module.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType

from ..paths import kernel_cache_dir
from .identity import Variant
from .rendering import render
from .spec import KernelSpec, TuningParams

_modules: dict[tuple[KernelSpec, TuningParams, bool], ModuleType] = {}
_lock = threading.Lock()


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def module_path(variant: Variant, cache_dir: Path | None = None) -> Path:
    return (cache_dir or kernel_cache_dir()) / f"{variant.name}.py"


def write_module(variant: Variant, cache_dir: Path | None = None) -> Path:
    """Render ``variant`` into the cache (if not already there) and return its path."""
    path = module_path(variant, cache_dir)
    source = render(variant.spec, variant.params, name=variant.name)
    try:
        if path.read_text() == source:
            return path
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(source)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_module(spec: KernelSpec, params: TuningParams) -> ModuleType:
    """The imported module of a variant, rendered and cached on first use.

    Memoized per process and per interpreter mode (Triton decides at decoration time
    whether a kernel is compiled or interpreted). The memo is keyed by the frozen
    dataclasses themselves, so a hit costs a dict lookup, not a digest.
    """
    key = (spec, params, interpreting())
    module = _modules.get(key)
    if module is not None:
        return module
    with _lock:
        module = _modules.get(key)
        if module is None:
            variant = Variant(spec, params)
            path = write_module(variant)
            mod_name = f"fa2gen._generated.{variant.name}{'_interp' if key[2] else ''}"
            import_spec = importlib.util.spec_from_file_location(mod_name, path)
            module = importlib.util.module_from_spec(import_spec)
            sys.modules[mod_name] = module
            import_spec.loader.exec_module(module)
            _modules[key] = module
    return module
