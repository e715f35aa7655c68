"""Choose the tuning params for a problem on a device, once per bucket.

The first call in a bucket walks the lookup chain (``lookup.choose``); later calls
in the same bucket pay a bucket computation and a dict lookup.
"""

from __future__ import annotations

import threading

from ..generator.spec import TuningParams
from ..store.buckets import bucket_fields
from .device import DeviceInfo
from .lookup import Choice, choose, close_readers
from .problem import Problem

_memo: dict[tuple, Choice] = {}
_lock = threading.Lock()

# attention()'s launches, keyed by everything about a call except the tensors' addresses
# (see api._call_key). Bounded: a workload with ever new shapes starts over.
_launches: dict[tuple, object] = {}
_LAUNCHES_MAX = 4096


def cached_launch(key: tuple):
    return _launches.get(key)


def remember_launch(key: tuple, launch) -> None:
    with _lock:
        if len(_launches) >= _LAUNCHES_MAX:
            _launches.clear()
        _launches[key] = launch


def explain(problem: Problem, device: DeviceInfo | None, direction: str = "fwd") -> Choice:
    """The params for ``problem``'s ``direction`` on ``device`` (None: CPU interpreter) and
    where they came from."""
    # (packed batches, ALiBi and dropout share their buckets with the plain calls but not their configs)
    key = (device, bucket_fields(problem, direction), problem.varlen, problem.alibi, problem.dropout)
    choice = _memo.get(key)
    if choice is None:
        found = choose(problem, device, direction)
        with _lock:
            choice = _memo.setdefault(key, found)
    return choice


def select_params(problem: Problem, device: DeviceInfo | None, direction: str = "fwd") -> TuningParams:
    return explain(problem, device, direction).params


def clear_memo() -> None:
    """Forget every memoised choice and cached DB reader (after tuning, importing configs, or in tests)."""
    with _lock:
        _memo.clear()
        _launches.clear()
    close_readers()
