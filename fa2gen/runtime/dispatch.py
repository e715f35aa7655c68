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


def explain(problem: Problem, device: DeviceInfo | None) -> Choice:
    """The params for ``problem`` on ``device`` (None: CPU interpreter) and where they came from."""
    key = (device, bucket_fields(problem))
    choice = _memo.get(key)
    if choice is None:
        found = choose(problem, device)
        with _lock:
            choice = _memo.setdefault(key, found)
    return choice


def select_params(problem: Problem, device: DeviceInfo | None) -> TuningParams:
    return explain(problem, device).params


def clear_memo() -> None:
    """Forget every memoised choice and cached DB reader (after tuning, importing configs, or in tests)."""
    with _lock:
        _memo.clear()
    close_readers()
