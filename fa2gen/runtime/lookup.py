"""Where a call's tuning params come from, in order of preference.

1. the exact bucket: in the user's tuned database (this device, same Triton), then in this
   device's shipped YAML file, then in any shipped file of the same arch;
2. the nearest bucket of the same kernel, in the same order of sources; fp16 and bf16 take
   each other's buckets too, half a doubling farther (``Bucket.gap``): a dtype not tuned on this
   device takes the other's configs before the default;
3. the heuristic default.

An exact bucket from any source beats a nearest one: a partial tune into the user's database
must not take the buckets it never touched from the shipped file's exact entries.

"Nearest" means at most ``MAX_DISTANCE`` doublings away, summed over the rounded
dimensions; farther than that a tuned config says little and the default is used.
An entry whose params no longer render to the code it was measured on (``Entry.current``:
a template change that alters its variant, not a comment edit) is skipped, and so are the
database's entries of another Triton; where no shipped file was tuned under the installed
Triton, those of the nearest version tuned answer first (``by_triton``). A
corrupt database or file warns once and falls back: a lookup never fails a call.
``FA2GEN_DISABLE_TUNED=1`` skips 1 and 2. Dispatch memoises the answer per bucket.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from dataclasses import dataclass

from .. import compat
from ..generator.arch import fits
from ..generator.spec import TuningParams
from ..store.buckets import Bucket
from .defaults import bucket_default
from .device import DeviceInfo
from .problem import Problem

log = logging.getLogger(__name__)
MAX_DISTANCE = 4.0
_warned: set[str] = set()


@dataclass(frozen=True)
class Choice:
    params: TuningParams
    source: str  # "db", "db-nearest", "shipped", "shipped-nearest", "shipped-arch", "default"
    bucket: Bucket | None = None  # the bucket the params were tuned for
    triton: str | None = None  # the Triton version they were tuned under


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=4)


def tuned_disabled() -> bool:
    return os.environ.get("FA2GEN_DISABLE_TUNED", "0") not in ("", "0")


def _validity(device: DeviceInfo):
    import triton

    from ..store.records import Validity

    return Validity(device.name, f"{device.capability[0]}.{device.capability[1]}", triton.__version__)


def _nearest(bucket: Bucket, entries, spec, arch):
    """The nearest of ``entries`` (same kernel, or the sibling dtype's a little farther:
    ``Bucket.gap``; within MAX_DISTANCE) that fits and whose code is unchanged (checked last: it
    renders the entry's variant once per process)."""
    gaps = ((bucket.gap(e.bucket), i, e) for i, e in enumerate(entries))
    near = sorted(((g, i, e) for g, i, e in gaps if g is not None), key=lambda t: t[:2])
    for d, _, e in near:
        if d <= MAX_DISTANCE and fits(spec, e.params, arch) is None and e.current:
            return e
    return None


_readers: dict = {}
_readers_lock = threading.Lock()


def _reader(path):
    """One read-only connection pool per database file, opened on first use."""
    from ..store.db import TunedDB

    with _readers_lock:
        db = _readers.get(path)
        if db is None:
            db = _readers[path] = TunedDB(path, readonly=True)
    return db


def close_readers() -> None:
    """Drop cached database readers (a replaced file is then opened afresh)."""
    with _readers_lock:
        for db in _readers.values():
            db.dispose()
        _readers.clear()


def _from_db(bucket, validity, spec, arch, exact: bool) -> Choice | None:
    """The database's entry for ``bucket`` (``exact``) or its nearest one."""
    from ..store.db import default_db_path

    path = default_db_path()
    if not path.exists():  # never create a database just to look something up
        return None
    try:
        db = _reader(path)
        if exact:
            found = db.get(validity, bucket)
            if found is not None and fits(spec, found.params, arch) is None:
                return Choice(found.params, "db", found.bucket, validity.triton)
            return None
        same = list(
            db.entries(
                device=validity.device, capability=validity.capability, triton=validity.triton, schema=validity.schema
            )
        )
        near = _nearest(bucket, same, spec, arch)
        if near is None and log.isEnabledFor(logging.DEBUG):
            log.debug(
                "fa2gen: %d entries in %s tuned under another Triton or on changed code; skipped",
                db.count_stale(validity),
                path,
            )
    except Exception as e:  # StoreError, OSError, SQLAlchemyError, or worse: never fail the call
        _warn_once(f"db:{path}", f"fa2gen: tuned database {path} unusable, falling back: {e}")
        return None
    return Choice(near.params, "db-nearest", near.bucket, validity.triton) if near else None


def _from_shipped(bucket, validity, spec, arch, exact: bool) -> Choice | None:
    """The shipped files' entry for ``bucket`` (``exact``) or their nearest one."""
    from ..store.shipped import shipped_files

    try:
        files = shipped_files(arch)
    except Exception as e:  # unreadable folder: fall back, never fail the call
        _warn_once(f"shipped:{arch}", f"fa2gen: shipped tuned configs unusable, falling back: {e}")
        return None
    own, arch_files = in_order(files, validity)
    # An exact bucket, the device's own or another's of the arch, before any nearest one: a
    # bucket tuned on a sibling GPU says more than a neighbour tuned on this one. An entry
    # whose params no longer render to the code it was measured on is skipped.
    if not exact:
        for group, source in ((own, "shipped-nearest"), (arch_files, "shipped-arch")):
            for cfg in group:
                near = _nearest(bucket, cfg.entries, spec, arch)
                if near:
                    return Choice(near.params, source, near.bucket, cfg.meta["triton"])
        return None
    for group, source in ((own, "shipped"), (arch_files, "shipped-arch")):
        for cfg in group:
            for e in cfg.entries:
                if e.bucket == bucket and fits(spec, e.params, arch) is None:
                    if e.current:
                        return Choice(e.params, source, e.bucket, cfg.meta["triton"])
                    log.debug(
                        "fa2gen: shipped %s/%s entry for %s tuned on other code; skipped",
                        arch,
                        cfg.meta["device"],
                        bucket.key,
                    )
    return None


def in_order(files, validity) -> tuple[list, list]:
    """The shipped (device, file) pairs ``files`` as they answer on ``validity``'s device:
    its own files, then other devices' of the arch, each by Triton version (``by_triton``)."""
    own = by_triton([cfg for device, cfg in files if device == validity.device], validity.triton)
    others = by_triton([cfg for device, cfg in files if device != validity.device], validity.triton)
    return own, others


def by_triton(files, installed: str) -> list:
    """``files`` in the order their Triton versions answer for ``installed``: its own first,
    then by distance in minor versions, the older first on a tie. Params only choose tiles,
    so another version's are as correct as its own; docs/tuning.md has what they measured."""
    here = compat.parse_version(installed)

    def rank(cfg) -> tuple:
        tuned = compat.parse_version(cfg.meta["triton"])
        return cfg.meta["triton"] != installed, abs((tuned[0] - here[0]) * 100 + tuned[1] - here[1]), tuned > here

    return sorted(files, key=rank)


def choose(problem: Problem, device: DeviceInfo | None, direction: str = "fwd") -> Choice:
    """The params for ``problem``'s ``direction`` on ``device`` (None: the CPU interpreter)."""
    spec = problem.kernel_spec(direction)
    arch = device.arch if device else "cpu"
    bucket = Bucket.of(problem, spec.direction)
    if spec.alibi or spec.dropout:  # nor have ALiBi and dropout (tuned entries may be Gluon's): the
        # bucket's default for the call's own kernel, Triton's
        return Choice(bucket_default(bucket, arch, spec=spec), "default")
    if device is not None and not tuned_disabled():
        validity = _validity(device)
        for exact in (True, False):  # an exact bucket from any source, then the nearest
            for source in (_from_db, _from_shipped):
                found = source(bucket, validity, spec, arch, exact)
                # Newer GPUs share sm90's configs, but the Gluon forward issues Hopper's wgmma.
                if found is not None and not (found.params.gluon and device.capability[0] != 9):
                    return found
    return Choice(bucket_default(bucket, arch), "default")
