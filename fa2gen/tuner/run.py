"""Tune a list of buckets: warm-start each study, run it, store the winner."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import optuna

from ..generator.rendering import template_hash
from ..generator.spec import TuningParams
from ..runtime.defaults import bucket_default
from ..store.buckets import SIBLING_DTYPES, Bucket
from ..store.db import TunedDB
from ..store.records import Entry, Validity
from .evaluate import Evaluator
from .space import SearchSpace, gluon_candidates, local_moves, prune_reason, space_for
from .study import BucketResult, study_name, tune_bucket

NEIGHBOURS = 3  # best configs of the nearest tuned buckets enqueued as warm starts


@dataclass(frozen=True)
class TuneOptions:
    trials: int = 40
    time_budget_s: float | None = None
    sampler: str = "tpe"
    seed: int | None = 0
    resume: bool = True
    batch: int = 8


def _use_wal(url: str) -> None:
    """Put a SQLite study file in WAL mode (a persistent property of the file), so that
    readers do not block the tuners writing to it."""
    import sqlite3

    from sqlalchemy.engine import make_url

    path = make_url(url).database
    if not path or path == ":memory:":
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path, timeout=60)
    try:
        con.execute("PRAGMA journal_mode=WAL")
    finally:
        con.close()


def open_storage(url: str, attempts: int = 5) -> optuna.storages.BaseStorage:
    """Any Optuna storage URL; SQLite files get a long busy timeout for concurrent tuners.

    Two processes opening a fresh storage at once race to create its tables and version
    row, and the loser sees "table ... already exists" or a UNIQUE failure on
    alembic_version: it retries and finds them made.
    """
    from sqlalchemy.exc import IntegrityError, OperationalError

    kwargs = {}
    if url.startswith("sqlite:"):
        kwargs = {"engine_kwargs": {"connect_args": {"timeout": 60}}}
        _use_wal(url)
    for attempt in range(attempts):
        try:
            return optuna.storages.RDBStorage(url, **kwargs)
        except (OperationalError, IntegrityError) as e:
            racing = "already exists" in str(e) or "alembic_version" in str(e)
            if not racing or attempt == attempts - 1:
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def _dq_twins(bucket: Bucket, default: TuningParams, space: SearchSpace) -> list[TuningParams]:
    """For a backward bucket, the default tiles with dQ computed each other way the space
    offers (the bulk reduction through host descriptors): every backward study then measures
    them side by side, however few its trials. (The matmul over stored dS runs on the Gluon
    dK/dV kernel's tiles, not the Triton default's: its candidates are GLUON_BWD_CANDIDATES.)"""
    if bucket.direction != "bwd":
        return []
    twins = []
    for mode in space.dq_mode:
        if mode == "matmul":
            continue
        twin = default.replace(dq_mode=mode, loads="tma_host" if mode == "tma_reduce" else default.loads)
        if mode != default.dq_mode and prune_reason(space, bucket.kernel_spec(), bucket, twin) is None:
            twins.append(twin)
    return twins


def _moves(bucket: Bucket, default: TuningParams, space: SearchSpace) -> list[TuningParams]:
    """The default's one-knob neighbours that pass the static rules (a pruned warm start
    would spend a trial): with few trials a study measures the default's surroundings
    before the sampler's guesses. In the H200's first backward re-tune (16 trials, 8 of
    them random start-up) the studies beat their default by over 2% in 2 of 72 buckets and
    had tried 48 of the 548 one-knob neighbours."""
    spec = bucket.kernel_spec()
    return [p for p in local_moves(space, default) if prune_reason(space, spec, bucket, p) is None]


def earlier_params(db: TunedDB, validity: Validity, bucket: Bucket, limit: int = 1) -> list[TuningParams]:
    """The newest ``limit`` winners stored for this bucket on this device under other Triton
    versions or schemas, or on code that has changed since: after a template change,
    re-tuning measures the old winner at once."""
    entries = [
        e
        for e in db.entries(device=validity.device, capability=validity.capability, bucket=bucket.key)
        if e.validity != validity or not e.current
    ]
    entries.sort(key=lambda e: e.created_at, reverse=True)
    return _distinct_params(entries, limit)


def sibling_params(db: TunedDB, validity: Validity, bucket: Bucket) -> list[TuningParams]:
    """The winner stored for this bucket in the other 16-bit dtype under the same validity.
    fp16 and bf16 run the same generated code but for the element type, so one's winner is
    a likely point for the other, and one a study of few trials may never draw."""
    other = SIBLING_DTYPES.get(bucket.dtype)
    if other is None:
        return []
    twin = db.get(validity, dataclasses.replace(bucket, dtype=other))
    return [twin.params] if twin else []


def shipped_params(validity: Validity, bucket: Bucket, arch: str) -> list[TuningParams]:
    """This bucket's params in the shipped files of ``arch``: the point dispatch runs today
    without this run's entry, from any device (the arch fallback runs them here) and any
    Triton version, the device's own and the nearest version first; entries tuned on code
    that has changed since too (their params are still the likeliest point). A study that
    measures them stores nothing slower than what users already get."""
    from ..runtime.lookup import in_order
    from ..store.shipped import shipped_files

    own, others = in_order(shipped_files(arch), validity)
    entries = sorted(
        (e for cfg in own + others for e in cfg.entries if e.bucket == bucket), key=lambda e: not e.current
    )
    return _distinct_params(entries, limit=len(entries))


def contiguous_params(db: TunedDB, validity: Validity, bucket: Bucket, arch: str, limit: int = 2) -> list[TuningParams]:
    """For a paged decode bucket, the winners of the same bucket on a contiguous cache: this
    run's own, then the shipped ones. The paged kernel runs the same tiles and only forms its
    row addresses through the block table, so the contiguous winner is a likely point that a
    paged study of few trials may never draw (on the H100 at batch 8, one token and 512 keys,
    as graph replays of a paged loop with 32-bit row indices: 16.1 us on the contiguous
    winner, 19.4 on what a 12-trial paged study had stored)."""
    if not bucket.page:
        return []
    twin = dataclasses.replace(bucket, page=0)
    stored = db.get(validity, twin)
    found = ([stored.params] if stored else []) + shipped_params(validity, twin, arch)
    return list(dict.fromkeys(found))[:limit]  # distinct, in order


def neighbour_params(db: TunedDB, validity: Validity, bucket: Bucket, limit: int = NEIGHBOURS) -> list[TuningParams]:
    """Best params of the nearest already-tuned buckets of the same kernel."""
    entries = [e for e in db.current(validity) if e.bucket.same_kernel(bucket) and e.bucket != bucket]
    entries.sort(key=lambda e: bucket.distance(e.bucket))
    return _distinct_params(entries, limit)


def _distinct_params(entries: list[Entry], limit: int) -> list[TuningParams]:
    """The first ``limit`` distinct params of ``entries``, in their order."""
    out: list[TuningParams] = []
    for e in entries:
        if e.params not in out:
            out.append(e.params)
        if len(out) == limit:
            break
    return out


def tune(
    buckets: list[Bucket],
    evaluator: Evaluator,
    space: SearchSpace,
    *,
    db: TunedDB,
    storage: optuna.storages.BaseStorage,
    validity_for: Callable[[Bucket], Validity],
    options: TuneOptions,
    on_bucket_start: Callable[[int, Bucket], None] | None = None,
    on_progress: Callable[[int, float | None], None] | None = None,
) -> list[BucketResult]:
    """Tune each bucket in turn; each winner goes to ``db`` as soon as its study ends."""
    deadline = time.time() + options.time_budget_s if options.time_budget_s else None
    results = []
    for i, bucket in enumerate(buckets):
        if deadline is not None and time.time() >= deadline:
            break
        if on_bucket_start:
            on_bucket_start(i, bucket)
        validity = validity_for(bucket)
        # a study searches its direction's templates as they are: their hash names it
        prefix = f"{validity.device}|{validity.capability}|{validity.triton}|{template_hash(bucket.direction)}"
        bucket_space = space_for(space.arch, bucket.direction, bucket.varlen)
        if not options.resume:
            try:
                optuna.delete_study(study_name=study_name(prefix, bucket, bucket_space), storage=storage)
            except KeyError:
                pass
        default = bucket_default(bucket, space.arch)
        spec = bucket.kernel_spec()
        # The entry the database holds for this very bucket (another study's, or one imported
        # from a shipped file) is measured early, so that it competes in this study's timing.
        stored = db.get(validity, bucket)
        own = [stored.params] if stored else []
        kept = [
            p
            for p in (
                own
                + earlier_params(db, validity, bucket)
                + shipped_params(validity, bucket, space.arch)
                + contiguous_params(db, validity, bucket, space.arch)
                + sibling_params(db, validity, bucket)
            )
            if prune_reason(bucket_space, spec, bucket, p) is None
        ]
        result = tune_bucket(
            bucket,
            evaluator,
            bucket_space,
            storage=storage,
            name_prefix=prefix,
            trials=options.trials,
            sampler=options.sampler,
            seed=options.seed,
            deadline=deadline,
            batch=options.batch,
            warm_start=(
                kept
                + _dq_twins(bucket, default, bucket_space)
                + neighbour_params(db, validity, bucket)
                + gluon_candidates(bucket_space, spec, bucket)
                + _moves(bucket, default, bucket_space)
            ),
            default=default,
            on_progress=on_progress,
        )
        if result.best is not None:
            # Where the study timed the stored entry's params, its winner beat them in one
            # study and replaces the entry even if the entry's own time, from another, is lower.
            compared = stored is not None and stored.params in result.completed
            db.put(
                [
                    Entry(
                        validity=validity,
                        bucket=bucket,
                        params=result.best,
                        measurement=result.measurement,
                        default_ms=result.default_ms,
                        trials=result.trials,
                    )
                ],
                superseding=stored if compared else None,
            )
        results.append(result)
    return results
