"""One Optuna study per (device, Triton, template, bucket), driven by ask and tell.

Each round asks for a batch of trials, prunes the statically invalid ones, compiles
the rest in parallel, then measures them one by one on the GPU. Everything a resumed
run needs lives in Optuna's storage: finished trials are never re-measured, and the
trials of a killed run that were still running are marked failed on the next start.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import time
import zlib
from dataclasses import dataclass
from typing import Callable

import optuna
from optuna.trial import TrialState

from ..generator.arch import fits
from ..generator.spec import TuningParams
from ..store.buckets import Bucket
from ..store.records import Measurement
from .evaluate import DeviceFault, Evaluator, Rejected
from .space import SearchSpace, prune_reason

log = logging.getLogger(__name__)
DECIDED = (TrialState.COMPLETE, TrialState.PRUNED)
STATIC = "static_prune"  # user attr of a trial the static rules pruned (never compiled)
MAX_ASKS_PER_TRIAL = 10


@dataclass(frozen=True)
class BucketResult:
    bucket: Bucket
    best: TuningParams | None
    measurement: Measurement | None
    default_ms: float | None
    trials: int  # decided trials in the study that the static rules did not prune
    measured: int  # trials measured by this run
    completed: frozenset[TuningParams] = frozenset()  # every point the study has timed


def bucket_seed(seed: int | None, bucket: Bucket) -> int | None:
    """The sampler seed of one bucket's study: reproducible, but not the same for every
    bucket, whose studies would otherwise all draw the same random start-up points (the
    H200's 72 backward studies did) and so share nothing new through their neighbours."""
    if seed is None:
        return None
    return (seed * 1_000_003 + zlib.crc32(bucket.key.encode())) % 2**32


def make_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        # multivariate: tile sizes interact; constant_liar: batches of asked trials spread out
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True, n_startup_trials=8)
    if name == "brute":
        import warnings

        with warnings.catch_warnings():  # experimental since Optuna 3.1, and what we want
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.BruteForceSampler(seed=seed)
    raise ValueError(f"--sampler: choose tpe or brute, got {name!r}")


def study_name(prefix: str, bucket: Bucket, space: SearchSpace) -> str:
    # The space's digest: a changed space (a knob's choices) starts new studies rather than
    # failing to resume the old ones, which stay in the storage as they were.
    return f"{prefix}|{space.digest()}|{bucket.key}"


def _me() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


STALE_AFTER_S = 15 * 60  # no trial (compile timeout included) runs this long
NAMELESS_GRACE_S = 2.0


def _orphaned(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether a RUNNING trial belongs to a tuner that is gone.

    On this host: its process no longer exists. From another host (a previous machine):
    it started longer ago than any trial can take. Unnamed: see below.
    """
    worker = trial.user_attrs.get("worker")
    started = trial.datetime_start
    age = (datetime.datetime.now() - started).total_seconds() if started else 0.0
    if worker is None:
        # A live tuner names itself within milliseconds of asking; a nameless trial older
        # than that was asked by a tuner killed in between. (Failing a live one by mistake
        # only costs a repeated measurement: its late tell is skipped.)
        return age > NAMELESS_GRACE_S
    host, _, pid = worker.rpartition(":")
    if host == socket.gethostname():
        try:
            os.kill(int(pid), 0)
            return False
        except (ProcessLookupError, ValueError):
            return True
        except PermissionError:
            return False
    return age > STALE_AFTER_S


def _fail_orphans(study: optuna.Study) -> int:
    """Mark trials left RUNNING by a tuner that is gone as failed (re-queued below)."""
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    # A nameless trial younger than the grace period may belong to a live tuner that is
    # about to name it, or to one killed a moment ago: wait out the grace, then look again.
    now = datetime.datetime.now()
    young = [
        (now - t.datetime_start).total_seconds()
        for t in running
        if t.user_attrs.get("worker") is None and t.datetime_start is not None
    ]
    young = [age for age in young if age <= NAMELESS_GRACE_S]
    if young:
        time.sleep(NAMELESS_GRACE_S - min(young) + 0.05)
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    n = 0
    for t in running:
        if _orphaned(t):
            _tell(study, t.number, state=TrialState.FAIL)
            n += 1
    return n


def _tell(study: optuna.Study, trial, value=None, state=None) -> optuna.trial.FrozenTrial:
    """study.tell, tolerating two things that leave the trial recorded:
    - BruteForceSampler's call of study.stop() once the space is exhausted (meant for
      study.optimize; the trial is recorded before it raises);
    - another tuner on the same study finishing the trial between tell's check that it is
      still running and its write (two tuners can pop the same queued trial: SQLite has no
      row locks). The first result stands, as skip_if_finished would have kept it."""
    number = trial if isinstance(trial, int) else trial.number
    try:
        return study.tell(trial, value, state=state, skip_if_finished=True)
    except optuna.exceptions.UpdateFinishedTrialError:
        pass
    except RuntimeError as e:
        if "Study.stop" not in str(e):
            raise
    return study.get_trials(deepcopy=False)[number]


def _attr(trial, key: str, value) -> None:
    """trial.set_user_attr, unless the trial is already finished: two tuners sharing a
    SQLite study can pop the same queued trial (SQLite has no row locks); the first to
    finish it wins and the other's updates are dropped."""
    try:
        trial.set_user_attr(key, value)
    except optuna.exceptions.UpdateFinishedTrialError:
        pass


def params_of(trial_params: dict) -> TuningParams:
    return TuningParams.from_dict(trial_params)


def _measurement_of(t: optuna.trial.FrozenTrial) -> Measurement:
    a = t.user_attrs
    return Measurement(
        median_ms=t.value, p20_ms=a["p20_ms"], p80_ms=a["p80_ms"], tflops=a["tflops"], max_error=a["max_error"]
    )


def tune_bucket(
    bucket: Bucket,
    evaluator: Evaluator,
    space: SearchSpace,
    *,
    storage: optuna.storages.BaseStorage | str,
    name_prefix: str,
    trials: int,
    sampler: str = "tpe",
    seed: int | None = 0,
    deadline: float | None = None,
    batch: int = 8,
    warm_start: list[TuningParams] = (),
    default: TuningParams | None = None,
    on_progress: Callable[[int, float | None], None] | None = None,
) -> BucketResult:
    """Run (or resume) the study for ``bucket`` until it has ``trials`` finished trials."""
    spec = bucket.kernel_spec()
    study = optuna.create_study(
        study_name=study_name(name_prefix, bucket, space),
        storage=storage,
        direction="minimize",
        sampler=make_sampler(sampler, bucket_seed(seed, bucket)),
        load_if_exists=True,
    )
    orphans = _fail_orphans(study)
    if orphans:
        log.info("fa2gen: %s: %d interrupted trials marked failed", bucket.key, orphans)
    # Points already decided (measured or pruned). Failed trials (cut off by the deadline or
    # by a killed run) are not decided: they run again when proposed or enqueued.
    seen: dict[TuningParams, optuna.trial.FrozenTrial] = {
        params_of(t.params): t for t in study.get_trials(deepcopy=False, states=DECIDED)
    }
    # Waiting, or running in another live tuner on the same study: not enqueued twice.
    queued = {
        params_of(t.params)
        for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING))
        if set(space.choices()) <= set(t.params)
    }
    # A run killed while its trial was being asked leaves only the params suggested so far:
    # that point is unknown, so only complete ones are queued again.
    names = set(space.choices())
    undecided = [
        params_of(t.params)
        for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
        if names <= set(t.params)
    ]
    for p in ([default] if default else []) + list(warm_start) + undecided:
        if space.contains(p) and p not in seen and p not in queued:
            study.enqueue_trial(space.point(p))
            queued.add(p)
    distributions = {
        name: optuna.distributions.CategoricalDistribution(values) for name, values in space.choices().items()
    }
    measured = 0

    def finished() -> int:
        # Only decided trials spend the budget: failed ones (cut off, interrupted) run again,
        # and points the static rules prune cost nothing. (A knob valid with few values of the
        # others, such as gluon, would otherwise spend most of a small budget on prunes.)
        return sum(1 for t in study.get_trials(deepcopy=False, states=DECIDED) if not t.user_attrs.get(STATIC))

    def best_value() -> float | None:
        done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        return min((t.value for t in done), default=None)

    exhausted = len(seen) >= space.size()
    asks = 0  # static prunes do not spend the budget: this bounds a sampler stuck proposing them
    while (
        not exhausted
        and finished() < trials
        and asks < MAX_ASKS_PER_TRIAL * trials
        and (deadline is None or time.time() < deadline)
    ):
        round_trials = []
        for _ in range(min(batch, trials - finished())):
            asks += 1
            try:
                trial = study.ask(distributions)
            except RuntimeError:  # brute force: every point has been tried
                exhausted = True
                break
            _attr(trial, "worker", _me())
            params = params_of(trial.params)
            previous = seen.get(params)
            if previous is not None:
                # The sampler proposed a point already decided: answer from the study, spend nothing.
                if previous.state == TrialState.COMPLETE:
                    for k, v in previous.user_attrs.items():
                        if k != "worker":
                            _attr(trial, k, v)
                    seen[params] = _tell(study, trial, previous.value)
                else:
                    _attr(trial, "prune_reason", previous.user_attrs.get("prune_reason", "duplicate"))
                    if previous.user_attrs.get(STATIC):
                        _attr(trial, STATIC, True)
                    seen[params] = _tell(study, trial, state=TrialState.PRUNED)
                continue
            if any(params == p for _, p in round_trials):
                # Proposed twice in one batch: run it once; this copy is dropped (FAIL is
                # ignored by the sampler, where PRUNED would mark a good point bad).
                _attr(trial, "fail_reason", "duplicate within a batch")
                _tell(study, trial, state=TrialState.FAIL)
                continue
            # The default is the baseline of every speedup: only a hard limit may stop it.
            why = fits(spec, params, space.arch) if params == default else prune_reason(space, spec, bucket, params)
            if why:
                _attr(trial, "prune_reason", why)
                _attr(trial, STATIC, True)
                seen[params] = _tell(study, trial, state=TrialState.PRUNED)
                continue
            round_trials.append((trial, params))
        exhausted = exhausted or len(seen) + len(round_trials) >= space.size()
        if not round_trials:
            if on_progress:
                on_progress(finished(), best_value())
            continue
        if deadline is not None and time.time() >= deadline:
            for trial, _ in round_trials:
                _tell(study, trial, state=TrialState.FAIL)  # not run: queued again on resume
            break
        compiled = evaluator.compile(bucket, [p for _, p in round_trials])
        for trial, params in round_trials:
            if deadline is not None and time.time() >= deadline:
                _tell(study, trial, state=TrialState.FAIL)  # not run: queued again on resume
                continue
            reason = compiled.get(params)
            if reason is None:
                try:
                    m = evaluator.measure(bucket, params)
                    measured += 1
                except Rejected as e:
                    reason = e.reason
                    if e.fatal:
                        # The device is unusable (an illegal access kills the CUDA context): the
                        # candidate is pruned for good and the run stops rather than prune the rest.
                        _attr(trial, "prune_reason", reason)
                        _tell(study, trial, state=TrialState.PRUNED)
                        for later, _ in round_trials:
                            _tell(study, later, state=TrialState.FAIL)
                        raise DeviceFault(f"{bucket.key}: {reason}") from None
            if reason is not None:
                _attr(trial, "prune_reason", reason)
                seen[params] = _tell(study, trial, state=TrialState.PRUNED)
                continue
            for k in ("p20_ms", "p80_ms", "tflops", "max_error"):
                _attr(trial, k, getattr(m, k))
            seen[params] = _tell(study, trial, m.median_ms)
            if on_progress:
                on_progress(finished(), best_value())
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    best = min(done, key=lambda t: t.value, default=None)
    default_ms = None
    if default is not None:
        d = [t for t in done if params_of(t.params) == default]
        default_ms = d[0].value if d else None
    return BucketResult(
        bucket=bucket,
        best=params_of(best.params) if best else None,
        measurement=_measurement_of(best) if best else None,
        default_ms=default_ms,
        trials=finished(),
        measured=measured,
        completed=frozenset(params_of(t.params) for t in done),
    )
