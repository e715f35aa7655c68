"""Choose the tuning params for a problem on a device.

Looked up once per (device arch, spec, query-length class) and memoised, so the
hot path pays a dict lookup. Later sources (a tuned database, shipped YAML) slot in
ahead of the heuristic default in ``_resolve``.
"""

from __future__ import annotations

import threading

from ..generator.spec import KernelSpec, TuningParams
from .defaults import default_params
from .problem import Problem

_memo: dict[tuple, TuningParams] = {}
_lock = threading.Lock()


def _seqlen_class(n: int) -> int:
    # Only short query lengths change the default tile; everything >= 128 shares one.
    return min(1 << max(0, (n - 1).bit_length()), 128)


def _resolve(spec: KernelSpec, arch: str, seqlen_q: int) -> TuningParams:
    return default_params(spec, arch, seqlen_q)


def select_params(problem: Problem, arch: str) -> TuningParams:
    spec = problem.kernel_spec()
    key = (arch, spec, _seqlen_class(problem.seqlen_q))
    params = _memo.get(key)
    if params is None:
        with _lock:
            params = _memo.setdefault(key, _resolve(spec, arch, key[2]))
    return params


def clear_memo() -> None:
    with _lock:
        _memo.clear()
