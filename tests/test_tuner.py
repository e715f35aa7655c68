"""The tuner's orchestration on CPU, with CostModelEvaluator standing in for GPU timing
(see fa2gen/tuner/evaluate.py). Optuna, its SQLite storage and the results DB are real."""

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from fa2gen.generator.descriptors.attn_bwd_gluon import GLUON_BWD_CANDIDATES
from fa2gen.generator.rendering import template_hash
from fa2gen.generator.spec import KernelSpec, SpecError, TuningParams
from fa2gen.runtime.defaults import bucket_default
from fa2gen.store.buckets import Bucket
from fa2gen.store.db import TunedDB
from fa2gen.store.records import Validity
from fa2gen.tuner.evaluate import CostModelEvaluator, Rejected, representative_problem
from fa2gen.tuner.grid import GridError, buckets_from_grid, default_buckets
from fa2gen.tuner.run import TuneOptions, open_storage, tune
from fa2gen.tuner.space import SPACES, local_moves, prune_reason, space_for
from fa2gen.tuner.study import DECIDED, STATIC

HERE = Path(__file__).parent
OPTIMUM = TuningParams(block_m=64, block_n=32, num_warps=4, num_stages=3, loads="tma_device")
B4K = Bucket("fwd", "fp16", 128, "causal", False, 1, 4096, 4096, 64)
VALID = Validity("TEST_GPU", "9.0", "3.6.0")


@pytest.fixture(autouse=True)
def no_shipped_files(tmp_path, monkeypatch):
    """Studies here warm-start from the shipped files of a test's own making, never from the
    repository's (tuner.run.shipped_params reads them)."""
    from fa2gen.store import shipped

    empty = tmp_path / "no-shipped"
    (empty / "sm90").mkdir(parents=True)
    monkeypatch.setattr(shipped, "shipped_root", lambda: empty)
    shipped.shipped_files.cache_clear()
    yield
    shipped.shipped_files.cache_clear()


def _entry(validity, bucket, params, *, fast=False, trials=5, **extra):
    """A stored entry: 1 ms against a default of 1.2 ms, or (``fast``) a time no study beats."""
    from fa2gen.store.records import Entry, Measurement

    m = Measurement(1e-6, 1e-6, 1e-6, 1e9, 0.0) if fast else Measurement(1.0, 0.9, 1.1, 100.0, 0.0)
    return Entry(validity, bucket, params, m, default_ms=1.0 if fast else 1.2, trials=trials, **extra)


def _tune(tmp_path, buckets, trials=30, sampler="tpe", evaluator=None, resume=True, arch="sm90"):
    db = TunedDB(tmp_path / "tuned.sqlite")
    storage = open_storage(f"sqlite:///{tmp_path / 'studies.sqlite'}")
    ev = evaluator or CostModelEvaluator(optimum=OPTIMUM)
    results = tune(
        buckets,
        ev,
        space_for(arch),
        db=db,
        storage=storage,
        validity_for=lambda b: VALID,
        options=TuneOptions(trials=trials, sampler=sampler, seed=1, resume=resume),
    )
    return db, storage, ev, results


def test_tune_beats_default_and_stores_the_winner(tmp_path):
    db, storage, ev, [r] = _tune(tmp_path, [B4K], trials=40)
    assert r.best is not None and r.default_ms is not None
    assert r.measurement.median_ms < r.default_ms  # the default (128x64, 4 warps, 2 stages, host TMA) is off-optimum
    assert r.measurement.median_ms <= 1.2 * ev.cost_ms(B4K, OPTIMUM)
    entry = db.get(VALID, B4K)
    assert entry.params == r.best and entry.trials == r.trials == 40
    assert entry.speedup == pytest.approx(r.default_ms / r.measurement.median_ms)


def test_tune_fp8_bucket(tmp_path):
    """fp8 buckets tune like the others. On sm89 (fp8 without tensor descriptors), whose space
    has 16-key steps, those are pruned: fp8 matmuls reduce over 32 at a time."""
    fp8 = Bucket("fwd", "fp8e4m3", 128, "none", False, 1, 4096, 4096, 64)
    assert 16 in space_for("sm89").block_n
    db, storage, ev, [r] = _tune(tmp_path, [fp8], trials=30, arch="sm89")
    assert db.get(VALID, fp8).params == r.best
    assert ev.compiled and all(p.block_n >= 32 for p in ev.compiled)
    small = TuningParams(block_m=64, block_n=16, num_warps=4, num_stages=2)
    assert "block_n >= 32" in prune_reason(space_for("sm89"), fp8.kernel_spec(), fp8, small)


def test_pruning_reasons_and_no_failed_trials(tmp_path):
    _, storage, _, _ = _tune(tmp_path, [B4K], trials=60)
    study = optuna.load_study(study_name=storage.get_all_studies()[0].study_name, storage=storage)
    trials = study.get_trials()
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert all(t.user_attrs.get("fail_reason") == "duplicate within a batch" for t in failed)
    reasons = [t.user_attrs["prune_reason"] for t in trials if t.state == TrialState.PRUNED]
    assert reasons and all(reasons)
    assert all(
        t.state == TrialState.COMPLETE
        for t in trials
        if "prune_reason" not in t.user_attrs and t.state != TrialState.FAIL
    )
    for t in trials:
        if t.state == TrialState.PRUNED:
            p = TuningParams(**t.params)
            why = prune_reason(space_for("sm90"), KernelSpec(head_dim=128, mask="causal"), B4K, p)
            stand_in = (p.num_warps == 8 and p.num_stages == 3 and p.loads == "tma_device") or (
                p.block_m == 32 and p.block_n == 64 and p.num_stages == 1
            )
            assert why is not None or stand_in, (p, t.user_attrs)


def test_compile_failures_and_wrong_results_are_pruned_with_reasons(tmp_path):
    from fa2gen.tuner.study import tune_bucket

    storage = open_storage(f"sqlite:///{tmp_path / 's.sqlite'}")
    wrong = TuningParams(32, 64, 4, 1, "pointer")
    broken = TuningParams(128, 64, 8, 3, "tma_device")
    tune_bucket(
        B4K,
        CostModelEvaluator(OPTIMUM),
        space_for("sm90"),
        storage=storage,
        name_prefix="t",
        trials=6,
        warm_start=[wrong, broken],
    )
    study = optuna.load_study(study_name=storage.get_all_studies()[0].study_name, storage=storage)
    reasons = {TuningParams(**t.params): t.user_attrs.get("prune_reason") for t in study.get_trials()}
    assert "wrong result" in reasons[wrong]
    assert "CompileError" in reasons[broken]
    assert all(t.state == TrialState.PRUNED for t in study.get_trials() if TuningParams(**t.params) in (wrong, broken))


def test_static_rules():
    space = space_for("sm90")
    spec = KernelSpec(head_dim=256, mask="none")
    big = TuningParams(block_m=256, block_n=256, num_warps=8, num_stages=4, loads="tma_host")
    assert "shared memory" in prune_reason(space, spec, B4K, big)
    assert "too small" in prune_reason(space, KernelSpec(), B4K, TuningParams(16, 32, 8, 2, "pointer"))
    short = Bucket("fwd", "fp16", 64, "none", False, 1, 16, 8192, 64)
    assert "query length" in prune_reason(space, KernelSpec(), short, TuningParams(64, 64, 4, 2, "pointer"))
    assert prune_reason(space, KernelSpec(), short, TuningParams(16, 64, 4, 2, "pointer")) is None
    assert "warp groups" in prune_reason(space, KernelSpec(), B4K, TuningParams(64, 64, 8, 2, "tma_host"))
    assert "search space" in prune_reason(SPACES["sm86"], KernelSpec(), B4K, TuningParams(64, 64, 4, 2, "tma_host"))
    sm86 = TuningParams(128, 64, 4, 3, "pointer")  # about 144 KB: fits sm90's 227 KB, not sm86's 99 KB
    assert "shared memory" in prune_reason(SPACES["sm86"], KernelSpec(head_dim=128), B4K, sm86)
    assert prune_reason(SPACES["sm90"], KernelSpec(head_dim=128), B4K, sm86) is None
    bwd, bwd_short = KernelSpec(direction="bwd"), Bucket("bwd", "fp16", 64, "none", False, 1, 32, 32, 64)
    assert "of a packed batch only" in prune_reason(space, bwd, B4K, TuningParams(128, 32, 4, 2, "tma_device"))
    assert "longest sequence" in prune_reason(space, bwd, bwd_short, TuningParams(64, 32, 4, 2, "pointer"))
    assert prune_reason(space, bwd, B4K, TuningParams(128, 32, 4, 3, "pointer")) is None
    bspace = space_for("sm90", "bwd")
    assert prune_reason(bspace, KernelSpec(direction="bwd", head_dim=128), B4K, TuningParams(64, 16, 8, 3)) is None
    assert "search space" in prune_reason(
        space, KernelSpec(direction="bwd", head_dim=128), B4K, TuningParams(64, 16, 8, 3)
    )
    assert "too small" in prune_reason(
        bspace, KernelSpec(direction="bwd", head_dim=16), B4K, TuningParams(16, 16, 8, 1)
    )


def test_brute_force_covers_small_space(tmp_path):
    """brute force on a decode bucket, whose query length prunes most of the space (sm80's,
    160 points: the orchestration is the same in any space, and a small one keeps it quick)."""
    short = Bucket("fwd", "fp16", 64, "none", False, 1, 16, 128, 64)
    _, storage, ev, [r] = _tune(tmp_path, [short], trials=1000, sampler="brute", arch="sm80")
    study = optuna.load_study(study_name=storage.get_all_studies()[0].study_name, storage=storage)
    points = {tuple(sorted(t.params.items())) for t in study.get_trials()}
    assert len(points) == space_for("sm80").size()  # every point decided once, then it stopped
    assert r.trials < 1000


def test_warm_start_uses_neighbours(tmp_path):
    db, storage, ev, _ = _tune(tmp_path, [B4K], trials=30)
    best = db.get(VALID, B4K).params
    neighbour = Bucket("fwd", "fp16", 128, "causal", False, 1, 8192, 8192, 32)
    _tune(tmp_path, [neighbour], trials=3)
    study = optuna.load_study(
        study_name=[s.study_name for s in storage.get_all_studies() if s.study_name.endswith(neighbour.key)][0],
        storage=storage,
    )
    first = [TuningParams(**t.params) for t in sorted(study.get_trials(), key=lambda t: t.number)[:2]]
    assert best in first  # enqueued right after the heuristic default


def test_no_resume_starts_over(tmp_path):
    _tune(tmp_path, [B4K], trials=10)
    _, _, ev, [r] = _tune(tmp_path, [B4K], trials=10, resume=False)
    assert r.trials == 10 and ev.calls > 0


def _finished(storage_url):
    """The trials that spent the studies' budgets, as the tuner counts them: decided, and not
    pruned by the static rules (which cost nothing)."""
    storage = open_storage(storage_url)
    n = 0
    for s in storage.get_all_studies():
        study = optuna.load_study(study_name=s.study_name, storage=storage)
        n += sum(1 for t in study.get_trials(states=DECIDED) if not t.user_attrs.get(STATIC))
    return n


def _driver(db, url, trials, limit, sleep_s, offset=0):
    return subprocess.Popen(
        [
            sys.executable,
            str(HERE / "tuner_driver.py"),
            str(db),
            url,
            str(trials),
            str(limit),
            str(sleep_s),
            str(offset),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(HERE.parent)},
    )


def test_resume_after_killed_process(tmp_path):
    db, url = tmp_path / "tuned.sqlite", f"sqlite:///{tmp_path / 'studies.sqlite'}"
    proc = _driver(db, url, 24, 1, 0.15)
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    # Killed once it reports its seventh measurement (the sixth trial is told by then): read from
    # its output, not polled from the storage, whose reads lag under load.
    measured = 0
    for line in proc.stdout:
        measured += line.startswith("measured")
        if measured == 7:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    watchdog.cancel()
    before = _finished(url)
    assert 6 <= before < 24
    storage = open_storage(url)
    study = optuna.load_study(study_name=storage.get_all_studies()[0].study_name, storage=storage)
    orphans = [t.params for t in study.get_trials(states=(TrialState.RUNNING,))]
    rerun = _driver(db, url, 24, 1, 0.0)
    out, _ = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, out
    assert _finished(url) >= 24
    remeasured = [line for line in out.splitlines() if line.startswith("measured")]
    assert len(remeasured) <= 24 - before  # finished trials were not measured again
    study = optuna.load_study(study_name=study.study_name, storage=storage)
    assert not study.get_trials(states=(TrialState.RUNNING,))  # the killed run's trial was closed
    decided = [t.params for t in study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))]
    names = set(space_for("sm90").choices())
    for params in orphans:  # ... and its point was run again, not skipped as a duplicate
        if set(params) == names:  # (killed between two suggestions, the point is unknown)
            assert params in decided
    assert len(list(TunedDB(db).entries())) == 1  # the resumed study stored its winner


def test_trial_killed_while_asked_is_not_guessed(tmp_path, monkeypatch):
    """A RUNNING trial with only some params (its tuner died between two suggestions) is
    failed on resume and not queued again as a point filled up with defaults."""
    from fa2gen.tuner import study as study_mod

    storage = open_storage(f"sqlite:///{tmp_path / 'studies.sqlite'}")
    prefix = f"{VALID.device}|{VALID.capability}|{VALID.triton}|{template_hash('fwd')}"
    study = optuna.create_study(
        study_name=study_mod.study_name(prefix, B4K, space_for("sm90")), storage=storage, direction="minimize"
    )
    # Two knobs away from the default, so that no warm start (a one-knob move) is that point.
    study.enqueue_trial({"block_m": 16, "block_n": 256})
    trial = study.ask()  # RUNNING, as the killed tuner left it
    trial.suggest_categorical("block_m", space_for("sm90").block_m)
    trial.suggest_categorical("block_n", space_for("sm90").block_n)
    trial.set_user_attr("worker", "another-host:1")
    monkeypatch.setattr(study_mod, "STALE_AFTER_S", -1.0)  # that host's trial is long stale
    partial = dict(study.trials[0].params)
    _tune(tmp_path, [B4K], trials=3)
    trials = optuna.load_study(study_name=study.study_name, storage=storage).trials
    assert trials[0].state == TrialState.FAIL and set(trials[0].params) == {"block_m", "block_n"}
    guessed = TuningParams.from_dict(partial)
    assert len(trials) > 1 and all(TuningParams.from_dict(t.params) != guessed for t in trials[1:])


def test_two_concurrent_tuners_share_one_db(tmp_path):
    db, url = tmp_path / "tuned.sqlite", f"sqlite:///{tmp_path / 'studies.sqlite'}"
    TunedDB(db)  # create the schema once, as a first run would
    procs = [_driver(db, url, 12, 3, 0.0, offset) for offset in (0, 3)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out
        assert "locked" not in out
    keys = {e.bucket.key for e in TunedDB(db).entries()}
    assert keys == {b.key for b in default_buckets()[:6]}


def test_grid_files(tmp_path):
    assert len(default_buckets()) == 120  # (16 of them packed batches')
    bs = buckets_from_grid(
        {
            "problems": [
                {
                    "dtypes": ["bf16"],
                    "head_dims": [96],
                    "masks": ["local"],
                    "groups": [3],
                    "seqlens_q": [100],
                    "seqlens_k": [5000],
                    "batch_heads": [48],
                }
            ]
        }
    )
    assert [b.key for b in bs] == ["fwd/bf16/d96/local/sc0/g4/q128/k8192/bh64"]
    fp8 = buckets_from_grid({"problems": [{"dtypes": ["fp8e4m3"], "head_dims": [128], "seqlens": [4096]}]})
    assert [b.kernel_spec().fp8 for b in fp8] == [True, True]  # none and causal
    for bad in (
        {"problems": [{"dtypes": ["fp8"]}]},
        {"problems": [{"head_dims": [12]}]},
        {"problems": [{"directions": ["bwd"], "dtypes": ["fp8e4m3"]}]},
        {"problems": [{"seqlens": [0]}]},
        {"problems": [{"colour": ["red"]}]},
        {"problem": []},
        {"problems": [{"seqlens": [5], "seqlens_q": [5]}]},
        "problems",
    ):
        with pytest.raises(GridError):
            buckets_from_grid(bad)


def test_representative_problem():
    s = representative_problem(Bucket("fwd", "fp16", 128, "none", False, 4, 2048, 2048, 128))
    assert (s.batch * s.heads_q, s.heads_q % 4, s.heads_q // s.heads_kv, s.seqlen_q) == (128, 0, 4, 2048)
    assert Bucket.of(s) == Bucket("fwd", "fp16", 128, "none", False, 4, 2048, 2048, 128)
    local = representative_problem(Bucket("fwd", "bf16", 64, "local", True, 1, 512, 512, 8))
    assert (local.mask, local.window_left, local.window_right, local.softcap > 0) == ("local", 256, 0, True)


def test_efficiency_script_dry_run(tmp_path):
    """benchmarks/tuner_efficiency.py end to end with the cost model (procedure only)."""
    out = tmp_path / "eff.json"
    r = subprocess.run(
        [
            sys.executable,
            str(HERE.parent / "benchmarks" / "tuner_efficiency.py"),
            "--cost-model",
            "--seeds",
            "2",
            "--max-trials",
            "60",
            "--buckets",
            "fwd/fp16/d64/none/sc0/g1/q512/k512/bh64",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(HERE.parent)},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    import json

    [row] = json.loads(out.read_text())
    assert row["valid"] < row["space"] and len(row["trials_to_2pct"]) == 2
    assert all(t is None or 1 <= t <= 60 for t in row["trials_to_2pct"])


def _job(kind, value):
    if kind == "sleep":
        time.sleep(value)
    elif kind == "crash":
        os._exit(1)
    elif kind == "raise":
        raise RuntimeError("ptxas says no")
    return value


def test_compile_pool_survives_hangs_crashes_and_errors():
    from fa2gen.tuner.evaluate import CompilePool

    pool = CompilePool(workers=2, timeout_s=3)
    try:
        t0 = time.time()
        out = pool.run(
            _job,
            {
                "hang": ("sleep", 60),
                "ok1": ("ok", 1),
                "err": ("raise", 0),
                "ok2": ("ok", 2),
                "crash": ("crash", 0),
                "ok3": ("ok", 3),
            },
        )
        assert time.time() - t0 < 40  # a hung job costs its timeout, not its runtime
    finally:
        pool.close()
    assert (out["ok1"], out["ok2"], out["ok3"]) == (1, 2, 3)
    assert "timed out" in out["hang"] and "timed out" in out["crash"]
    assert "ptxas says no" in out["err"]


class _DeadlineAfter(CostModelEvaluator):
    """Cost model whose measurements push the clock past a deadline after ``n`` of them."""

    def __init__(self, n):
        super().__init__(optimum=OPTIMUM)
        self.n = n

    def measure(self, bucket, params):
        m = super().measure(bucket, params)
        if self.calls >= self.n:
            time.sleep(1.5)
        return m


def test_deadline_cut_trials_run_on_resume(tmp_path):
    from fa2gen.tuner.study import tune_bucket

    storage = open_storage(f"sqlite:///{tmp_path / 's.sqlite'}")
    space = space_for("sm90")
    # One round of 80 asks: the static rules prune most of the sm90 space's points (gluon and
    # persistent ones among them), so a round must be wide to hold the candidates the
    # deadline cuts into.
    r1 = tune_bucket(
        B4K, _DeadlineAfter(0), space, storage=storage, name_prefix="t", trials=80, batch=80, deadline=time.time() + 2
    )
    study = optuna.load_study(study_name=storage.get_all_studies()[0].study_name, storage=storage)
    cut = [t.params for t in study.get_trials(states=(TrialState.FAIL,))]
    assert cut and r1.trials < 80
    r2 = tune_bucket(B4K, CostModelEvaluator(OPTIMUM), space, storage=storage, name_prefix="t", trials=80, batch=8)
    assert r2.trials == 80  # failed trials did not spend the budget
    decided = [t.params for t in study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))]
    assert all(p in decided for p in cut)  # ... and every cut-off point ran


def test_brute_force_study_resumes_after_an_orphan(tmp_path):
    from fa2gen.tuner.study import tune_bucket

    short = Bucket("fwd", "fp16", 64, "none", False, 1, 16, 128, 64)
    storage = open_storage(f"sqlite:///{tmp_path / 's.sqlite'}")
    space = space_for("sm80")  # 160 points, every one decided in the first run
    tune_bucket(
        short, CostModelEvaluator(OPTIMUM), space, storage=storage, name_prefix="t", trials=1000, sampler="brute"
    )
    study = optuna.load_study(study_name=storage.get_all_studies()[0].study_name, storage=storage)
    decided = study.get_trials(states=(TrialState.COMPLETE,))
    # A trial a dead tuner left running on this very space, then a resume.
    orphan = study.ask({k: optuna.distributions.CategoricalDistribution(v) for k, v in space.choices().items()})
    orphan.set_user_attr("worker", "elsewhere:1")
    storage.set_trial_system_attr(orphan._trial_id, "x", 1)
    r = tune_bucket(
        short, CostModelEvaluator(OPTIMUM), space, storage=storage, name_prefix="t", trials=1000, sampler="brute"
    )
    assert r.best is not None and len(study.get_trials(states=(TrialState.COMPLETE,))) >= len(decided)


def test_orphans_from_another_host_expire(monkeypatch):
    import datetime

    from fa2gen.tuner import study as study_mod

    class T:
        def __init__(self, worker, age_s):
            self.user_attrs = {"worker": worker}
            self.datetime_start = datetime.datetime.now() - datetime.timedelta(seconds=age_s)

    assert not study_mod._orphaned(T("some-other-host:123", 60))
    assert study_mod._orphaned(T("some-other-host:123", study_mod.STALE_AFTER_S + 60))
    import socket

    assert study_mod._orphaned(T(f"{socket.gethostname()}:999999999", 1))  # no such process here
    assert not study_mod._orphaned(T(f"{socket.gethostname()}:{os.getpid()}", 10**6))
    nameless = T(None, 60)
    nameless.user_attrs = {}
    assert study_mod._orphaned(nameless)


def test_default_is_measured_even_where_heuristics_would_prune_it(tmp_path):
    """sm86, D=128, one query: the default 16x32 tile with 4 warps breaks the 'tile too small'
    rule, but it is the baseline of the speedup, so it must still be measured."""
    decode = Bucket("fwd", "fp16", 128, "none", False, 1, 1, 8192, 64)
    from fa2gen.runtime.defaults import default_params

    default = default_params(decode.kernel_spec(), "sm86", 1)
    assert prune_reason(SPACES["sm86"], decode.kernel_spec(), decode, default) is not None
    db = TunedDB(tmp_path / "t.sqlite")
    storage = open_storage(f"sqlite:///{tmp_path / 's.sqlite'}")
    [r] = tune(
        [decode],
        CostModelEvaluator(OPTIMUM),
        SPACES["sm86"],
        db=db,
        storage=storage,
        validity_for=lambda b: VALID,
        options=TuneOptions(trials=10),
    )
    assert r.default_ms is not None


def test_two_tuners_on_the_same_studies(tmp_path):
    db, url = tmp_path / "tuned.sqlite", f"sqlite:///{tmp_path / 'studies.sqlite'}"
    TunedDB(db)
    open_storage(url)
    procs = [_driver(db, url, 16, 2, 0.02, 0) for _ in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out
    storage = open_storage(url)
    for s in storage.get_all_studies():
        study = optuna.load_study(study_name=s.study_name, storage=storage)
        assert len(study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))) >= 16
        assert not study.get_trials(states=(TrialState.RUNNING,))
    assert {e.bucket.key for e in TunedDB(db).entries()} == {b.key for b in default_buckets()[:2]}


def test_backward_buckets_tune_store_and_dispatch(tmp_path, monkeypatch):
    """Backward buckets are their own problems: own grid entries, their own space (no
    in-kernel descriptors), stored winners that attention()'s backward lookup finds (and
    the forward's does not)."""
    from fa2gen.runtime.device import DeviceInfo
    from fa2gen.runtime.lookup import choose
    from fa2gen.runtime.problem import Problem

    bwd = [b for b in default_buckets(("bwd",))]
    assert len(bwd) == 88 and {b.direction for b in bwd} == {"bwd"}
    assert len(default_buckets(("fwd", "bwd"))) == 120 + 88
    bucket = Bucket("bwd", "bf16", 64, "causal", False, 1, 2048, 2048, 256)
    db, storage, ev, [r] = _tune(
        tmp_path, [bucket], trials=25, evaluator=CostModelEvaluator(optimum=TuningParams(128, 32, 4, 3, "pointer"))
    )
    assert r.best is not None
    assert {p.loads for p in ev.compiled} <= {"pointer", "tma_host"}  # no in-kernel descriptors in its space
    study = optuna.load_study(study_name=storage.get_all_studies()[0].study_name, storage=storage)
    assert {t.params["block_n"] for t in study.trials} & {16}  # short steps are in its space
    # sm90 searches dQ in its own kernel, by a matmul over stored dS (not under a causal mask at
    # D=64, this bucket) and, at D=64, added by the Gluon one pass
    assert {p.dq_mode for p in ev.compiled} == {"separate", "atomic"}
    assert all(p.gluon == 1 for p in ev.compiled if p.dq_mode == "atomic")
    first, *after = (TuningParams(**t.params) for t in sorted(study.trials, key=lambda t: t.number))
    # ... the default first, the Gluon dK/dV candidates, then the default's one-knob neighbours
    # that pass the static rules, in order
    assert first == bucket_default(bucket, "sm90")
    from fa2gen.tuner.space import gluon_candidates

    gluon = gluon_candidates(space_for("sm90", "bwd"), bucket.kernel_spec(), bucket)
    moves = [
        m
        for m in local_moves(space_for("sm90", "bwd"), first)
        if prune_reason(space_for("sm90", "bwd"), bucket.kernel_spec(), bucket, m) is None
    ]
    assert gluon and after[: len(gluon)] == gluon
    after = after[len(gluon) :]
    assert len(moves) >= 6 and after[: len(moves)] == moves
    assert db.get(VALID, bucket).params == r.best
    problem = Problem(
        batch=8,
        heads_q=32,
        heads_kv=32,
        seqlen_q=2000,
        seqlen_k=2000,
        head_dim=64,
        dtype="bf16",
        mask="causal",
        window_left=-1,
        window_right=0,
        sm_scale=0.125,
        softcap=0.0,
    )
    device = DeviceInfo(name="TEST_GPU", capability=(9, 0), arch="sm90", sm_count=132)
    monkeypatch.setenv("FA2GEN_DB", str(tmp_path / "tuned.sqlite"))
    monkeypatch.setattr("fa2gen.runtime.lookup._validity", lambda dev: VALID)
    assert choose(problem, device, "bwd").params == r.best
    assert choose(problem, device, "fwd").source != "db"


def test_backward_dq_twins_where_the_space_has_both_ways(tmp_path):
    """Where a backward space holds both dQ ways (sm80: not yet measured), every study
    starts with the default's tiles each way, right after the default."""
    bucket = Bucket("bwd", "fp16", 64, "none", False, 1, 1024, 1024, 256)
    _, storage, _, [r] = _tune(
        tmp_path,
        [bucket],
        trials=4,
        arch="sm80",
        evaluator=CostModelEvaluator(optimum=TuningParams(64, 32, 4, 2, "pointer")),
    )
    study = optuna.load_study(study_name=storage.get_all_studies()[0].study_name, storage=storage)
    first, twin = (TuningParams(**t.params) for t in sorted(study.trials, key=lambda t: t.number)[:2])
    assert first == bucket_default(bucket, "sm80") and twin == first.replace(dq_mode="atomic")


def test_sm90_backward_studies_measure_dq_by_a_matmul_on_its_own_tiles(tmp_path):
    # dq_mode matmul runs on the Gluon dK/dV kernel's tiles, not as a twin of the Triton default
    # (whose 128 x 32 tiles it loses on): non-causal and causal studies at D=128 compile its
    # candidates, a causal one at D=64 never tries it (but tries the one pass, which D=128's
    # studies do not)
    from fa2gen.tuner.run import _dq_twins

    space = space_for("sm90", "bwd")
    full = Bucket("bwd", "fp16", 128, "none", False, 1, 4096, 4096, 64)
    assert _dq_twins(full, bucket_default(full, "sm90"), space) == []
    _, _, ev, _ = _tune(tmp_path, [full], trials=8)
    matmul = [p for p in GLUON_BWD_CANDIDATES if p.dq_mode == "matmul"]
    assert matmul and all(p in ev.compiled for p in matmul)
    causal = Bucket("bwd", "fp16", 128, "causal", False, 1, 4096, 4096, 64)
    _, _, ev, _ = _tune(tmp_path / "causal", [causal], trials=8)
    assert all(p in ev.compiled for p in matmul) and all(p.dq_mode != "atomic" for p in ev.compiled)
    short = Bucket("bwd", "fp16", 64, "causal", False, 1, 4096, 4096, 128)
    _, _, ev, _ = _tune(tmp_path / "short", [short], trials=8)
    assert ev.compiled and all(p.dq_mode != "matmul" for p in ev.compiled)
    one_pass = [p for p in GLUON_BWD_CANDIDATES if p.dq_mode == "atomic"]
    assert one_pass and all(p in ev.compiled for p in one_pass)


def test_each_bucket_samples_its_own_random_points(tmp_path):
    """Studies of different buckets get different sampler seeds (reproducible per bucket),
    so their random start-up trials differ instead of repeating one sequence everywhere."""
    from fa2gen.tuner.study import bucket_seed

    a, b = (
        Bucket("bwd", "fp16", 128, "none", False, 1, 4096, 4096, 64),
        Bucket("bwd", "bf16", 128, "none", False, 1, 4096, 4096, 64),
    )
    assert bucket_seed(0, a) == bucket_seed(0, a) != bucket_seed(0, b) and bucket_seed(None, a) is None
    _, storage, _, _ = _tune(tmp_path, [a, b], trials=20)
    sampled = []
    for bucket in (a, b):
        study = optuna.load_study(
            study_name=[s.study_name for s in storage.get_all_studies() if s.study_name.endswith(bucket.key)][0],
            storage=storage,
        )
        sampled.append(
            [
                TuningParams(**t.params)
                for t in sorted(study.trials, key=lambda t: t.number)
                if "fixed_params" not in t.system_attrs
            ]
        )
    assert sampled[0] and sampled[1] and sampled[0] != sampled[1]


def test_a_changed_space_starts_new_studies(tmp_path, monkeypatch):
    """Optuna cannot resume a study whose categorical choices changed: a tuner whose space
    lost a choice starts a study of its own and leaves the old one as it was."""
    import dataclasses

    import fa2gen.tuner.run as run_mod

    bucket = Bucket("bwd", "fp16", 64, "none", False, 1, 1024, 1024, 256)
    wide = dataclasses.replace(space_for("sm90", "bwd"), dq_mode=("separate", "atomic", "tma_reduce"))
    monkeypatch.setattr(run_mod, "space_for", lambda arch, direction="fwd", varlen=False: wide)
    _, storage, _, _ = _tune(tmp_path, [bucket], trials=4)
    monkeypatch.undo()
    old = storage.get_all_studies()
    assert len(old) == 1 and old[0].study_name.split("|")[-2] == wide.digest()
    before = len(optuna.load_study(study_name=old[0].study_name, storage=storage).trials)
    _, storage, _, [r] = _tune(tmp_path, [bucket], trials=4)  # raised ValueError when both shared one name
    names = {s.study_name: s for s in storage.get_all_studies()}
    assert r.best is not None and len(names) == 2 and space_for("sm90", "bwd").digest() != wide.digest()
    assert len(optuna.load_study(study_name=old[0].study_name, storage=storage).trials) == before


def test_local_moves_are_one_knob_steps():
    space = space_for("sm90", "bwd")
    p = TuningParams(128, 32, 8, 3, "pointer")
    moves = local_moves(space, p)
    assert moves == [
        p.replace(block_n=16),
        p.replace(block_n=64),
        p.replace(num_stages=2),
        p.replace(num_stages=4),
        p.replace(loads="tma_host"),
        p.replace(num_warps=4),
        p.replace(num_warps=16),
        p.replace(block_m=64),
        p.replace(block_m=256),
        p.replace(dq_mode="matmul"),
        p.replace(dq_mode="atomic"),
        p.replace(gluon=1),
        p.replace(gluon=2),
    ]
    # ends of a range move one way only; values outside the space are not proposed
    edge = TuningParams(16, 16, 4, 1, "pointer")
    assert local_moves(space, edge) == [
        edge.replace(block_n=32),
        edge.replace(num_stages=2),
        edge.replace(loads="tma_host"),
        edge.replace(num_warps=8),
        edge.replace(block_m=32),
        edge.replace(dq_mode="matmul"),
        edge.replace(dq_mode="atomic"),
        edge.replace(gluon=1),
        edge.replace(gluon=2),
    ]
    # a template's own knobs come first (the decode template's split count, then its combine)
    decode = local_moves(space_for("sm90", "decode"), TuningParams(16, 64, 4, 3, "pointer"))
    assert [m.splits for m in decode[:7]] == [1, 2, 4, 8, 16, 32, 64]
    assert [m.combine for m in decode[7:9]] == ["kernel", "last"] and decode[9].block_n == 32
    sm80 = space_for("sm80", "bwd")
    p80 = TuningParams(64, 64, 4, 3, "pointer")
    assert local_moves(sm80, p80) == [
        p80.replace(block_n=32),
        p80.replace(block_n=128),
        p80.replace(num_stages=2),
        p80.replace(num_warps=8),
        p80.replace(block_m=32),
        p80.replace(block_m=128),
        p80.replace(dq_mode="atomic"),
    ]


def test_tune_command_body_with_directions(tmp_path):
    """fa2gen tune's body with --directions bwd tunes backward buckets only (cost model)."""
    from fa2gen.cli import _run_tune
    from fa2gen.runtime.device import DeviceInfo

    db = tmp_path / "tuned.sqlite"
    _run_tune(
        "sm90",
        DeviceInfo("TEST_GPU", (9, 0), "sm90", 132),
        CostModelEvaluator(),
        None,
        4,
        None,
        db,
        f"sqlite:///{tmp_path / 'studies.sqlite'}",
        "tpe",
        True,
        0,
        2,
        "bwd",
    )
    keys = [e.bucket.key for e in TunedDB(db).entries()]
    assert len(keys) == 2 and all(k.startswith("bwd/") for k in keys)


def test_tune_untuned_skips_the_buckets_that_have_an_entry(tmp_path):
    """fa2gen tune --untuned tunes only the grid's buckets with no valid entry: an entry whose
    params no longer render to the code it was measured on (after a template change) does
    not count."""
    import triton

    from fa2gen.cli import _run_tune
    from fa2gen.runtime.device import DeviceInfo
    from fa2gen.tuner.grid import default_buckets

    first, second, third = default_buckets(("bwd",))[:3]
    db = TunedDB(tmp_path / "tuned.sqlite")
    now = Validity("TEST_GPU", "9.0", triton.__version__)
    held = TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=2, loads="tma_host")
    db.put(
        [
            _entry(now, first, held),
            _entry(now, second, held, code="ffffffffffffffff"),
        ]
    )
    ev = CostModelEvaluator()
    _run_tune(
        "sm90",
        DeviceInfo("TEST_GPU", (9, 0), "sm90", 132),
        ev,
        None,
        3,
        None,
        db.path,
        f"sqlite:///{tmp_path / 'studies.sqlite'}",
        "tpe",
        True,
        0,
        2,
        "bwd",
        True,
    )
    entries = {e.bucket: e for e in TunedDB(db.path).entries() if e.validity == now}
    assert set(entries) == {first, second, third}  # the first kept as it was; two tuned
    assert entries[first].trials == 5 and entries[second].trials == 3 and entries[third].trials == 3


def test_persistent_grids_are_searched_on_sm90_forward_only():
    from fa2gen.tuner.space import prune_reason

    space = space_for("sm90")
    assert space.persistent == (0, 1, 2, 3)
    assert space_for("sm90", "bwd").persistent == (0,) and space_for("sm80").persistent == (0,)
    default = bucket_default(B4K, "sm90")
    moves = local_moves(space, default)
    assert {m.persistent for m in moves} == {0, 1, 2, 3}
    # three an SM: the 64-row one-partition Gluon form's alone (its launch's registers)
    assert "64-row partition" in prune_reason(space, B4K.kernel_spec(), B4K, default.replace(persistent=3))
    # one program an SM: the Gluon forward's only (a Triton one halves occupancy), so that the
    # Triton default's persistent move that stands is two an SM
    assert "Triton" in prune_reason(space, B4K.kernel_spec(), B4K, default.replace(persistent=1))
    assert prune_reason(space, B4K.kernel_spec(), B4K, default.replace(persistent=2)) is None
    assert not any(m.persistent for m in local_moves(space_for("sm90", "bwd"), TuningParams(loads="tma_host")))


def test_static_prunes_do_not_spend_the_budget(tmp_path):
    """Points the static rules reject (most of the sm90 space's gluon points) cost nothing:
    the study runs until its budget of compiled and measured points is spent."""
    from fa2gen.tuner.study import STATIC

    _, storage, ev, [r] = _tune(tmp_path, [B4K], trials=24)
    study = optuna.load_study(study_name=storage.get_all_studies()[0].study_name, storage=storage)
    decided = [t for t in study.get_trials() if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    static = [t for t in decided if t.user_attrs.get(STATIC)]
    assert static and all(t.state == TrialState.PRUNED for t in static)
    assert r.trials == len(decided) - len(static) == 24


def test_earlier_winners_and_gluon_candidates_are_warm_starts(tmp_path):
    """After a template change the bucket's old winner is measured first, and every sm90
    forward study measures the Gluon candidates its bucket can run."""
    from fa2gen.generator.descriptors.attn_fwd_gluon import GLUON_CANDIDATES
    from fa2gen.tuner.space import gluon_candidates

    db = TunedDB(tmp_path / "tuned.sqlite")
    old = TuningParams(block_m=32, block_n=64, num_warps=4, num_stages=4, loads="pointer")
    stale = Validity("TEST_GPU", "9.0", "3.6.0")
    db.put([_entry(stale, B4K, old)])
    # D=128: every candidate but three programs an SM (D=64 only)
    runnable = gluon_candidates(space_for("sm90"), B4K.kernel_spec(), B4K)
    assert len(runnable) == len(GLUON_CANDIDATES) - 1
    _, storage, _, _ = _tune(tmp_path, [B4K], trials=2 + len(runnable))
    study = optuna.load_study(study_name=storage.get_all_studies()[0].study_name, storage=storage)
    first = [TuningParams(**t.params) for t in sorted(study.get_trials(), key=lambda t: t.number)]
    assert first[0] == bucket_default(B4K, "sm90") and first[1] == old
    assert set(runnable) <= set(first[: 2 + len(runnable)])


def test_the_stored_entry_competes_in_the_study_and_loses_to_a_faster_point(tmp_path):
    """A bucket's entry under the current template (another run's, or one imported from a
    shipped file) is measured in the study; a point that beats it there replaces it, although
    the entry's own time, taken in another run, is lower than anything this run measures."""

    db = TunedDB(tmp_path / "tuned.sqlite")
    held = TuningParams(block_m=128, block_n=128, num_warps=8, num_stages=2, loads="tma_host")
    ev = CostModelEvaluator(optimum=OPTIMUM)
    assert ev.cost_ms(B4K, held) > ev.cost_ms(B4K, OPTIMUM)
    db.put([_entry(VALID, B4K, held, fast=True)])
    _, storage, _, [r] = _tune(tmp_path, [B4K], trials=30, evaluator=ev)
    study = optuna.load_study(study_name=storage.get_all_studies()[0].study_name, storage=storage)
    first = [TuningParams(**t.params) for t in sorted(study.get_trials(), key=lambda t: t.number)]
    assert first[:2] == [bucket_default(B4K, "sm90"), held]
    assert held in r.completed and r.best != held
    entry = db.get(VALID, B4K)
    assert entry.params == r.best and entry.measurement.median_ms == pytest.approx(ev.cost_ms(B4K, r.best))


def test_the_other_16_bit_dtypes_winner_is_a_warm_start(tmp_path):
    """An fp16 study measures the bf16 winner of the same bucket right after its own entry:
    with three trials nothing else would reach it. An fp8 bucket has no sibling."""
    from fa2gen.tuner.run import sibling_params

    db = TunedDB(tmp_path / "tuned.sqlite")
    bf16 = Bucket("fwd", "bf16", 128, "causal", False, 1, 4096, 4096, 64)
    won = TuningParams(block_m=128, block_n=64, num_warps=8, num_stages=4, loads="tma_host", persistent=1, gluon=2)
    db.put([_entry(VALID, bf16, won, trials=40)])
    assert sibling_params(db, VALID, B4K) == [won]
    assert sibling_params(db, Validity("TEST_GPU", "9.0", "3.7.0"), B4K) == []
    fp8 = Bucket("fwd", "fp8e4m3", 128, "causal", False, 1, 4096, 4096, 64)
    assert sibling_params(db, VALID, fp8) == []
    ev = CostModelEvaluator(optimum=won)
    _, storage, _, [r] = _tune(tmp_path, [B4K], trials=3, evaluator=ev)
    study = optuna.load_study(
        study_name=[s.study_name for s in storage.get_all_studies() if s.study_name.endswith(B4K.key)][0],
        storage=storage,
    )
    first = [TuningParams(**t.params) for t in sorted(study.get_trials(), key=lambda t: t.number)]
    assert first[:2] == [bucket_default(B4K, "sm90"), won]
    assert r.best == won


def test_shipped_entries_of_the_bucket_are_warm_starts(tmp_path, monkeypatch):
    """A study measures what dispatch runs today from the shipped files, whatever device and
    Triton tuned it (another GPU of the arch, another version): the device's own and the
    nearest version first, and one measured on code that has changed since last."""
    from fa2gen.store import shipped
    from fa2gen.store.yamlfile import dump
    from fa2gen.tuner.run import shipped_params

    root = tmp_path / "shipped"
    (root / "sm90").mkdir(parents=True)
    monkeypatch.setattr(shipped, "shipped_root", lambda: root)
    shipped.shipped_files.cache_clear()
    own = TuningParams(block_m=128, block_n=64, num_warps=8, num_stages=3, loads="tma_host")
    near = TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=2, loads="tma_host")
    far = TuningParams(block_m=64, block_n=128, num_warps=4, num_stages=3, loads="tma_host")
    stale = TuningParams(block_m=64, block_n=32, num_warps=4, num_stages=2, loads="pointer")
    files = {
        "own": (VALID, own),
        "near": (Validity("OTHER_GPU", "9.0", "3.7.1"), near),
        "far": (Validity("OTHER_GPU", "9.0", "3.9.0"), far),
        "stale": (Validity("OTHER_GPU", "9.0", "3.6.0"), stale),
    }
    for name, (v, params) in files.items():
        code = "ffffffffffffffff" if name == "stale" else ""
        (root / "sm90" / f"{name}.yaml").write_text(
            dump(
                [_entry(v, B4K, params, trials=9, code=code)],
                arch="sm90",
                fa2gen_version="0.1.0",
                torch_version="2.11.0",
            )
        )
    shipped.shipped_files.cache_clear()
    try:
        assert shipped_params(VALID, B4K, "sm90") == [own, near, far, stale]
        assert shipped_params(dataclasses.replace(VALID, device="OTHER_GPU"), B4K, "sm90")[0] == near
        assert shipped_params(VALID, dataclasses.replace(B4K, seqlen_q=1024, seqlen_k=1024), "sm90") == []
        ev = CostModelEvaluator(optimum=far)
        _, storage, _, [r] = _tune(tmp_path, [B4K], trials=4, evaluator=ev)
        study = optuna.load_study(study_name=storage.get_all_studies()[0].study_name, storage=storage)
        first = [TuningParams(**t.params) for t in sorted(study.get_trials(), key=lambda t: t.number)]
        assert first[:4] == [bucket_default(B4K, "sm90"), own, near, far]
        assert r.best == far
    finally:
        shipped.shipped_files.cache_clear()


def test_a_stored_entry_the_study_could_not_time_keeps_its_place(tmp_path):
    """Where the study never timed the stored entry's params (here they fail to compile), only
    a faster time replaces it."""

    db = TunedDB(tmp_path / "tuned.sqlite")
    held = TuningParams(block_m=128, block_n=64, num_warps=8, num_stages=3, loads="tma_device")  # "fails to compile"
    db.put([_entry(VALID, B4K, held, fast=True)])
    _, storage, _, [r] = _tune(tmp_path, [B4K], trials=10)
    study = optuna.load_study(study_name=storage.get_all_studies()[0].study_name, storage=storage)
    [trial] = [t for t in study.get_trials() if TuningParams(**t.params) == held]
    assert trial.state == TrialState.PRUNED and "CompileError" in trial.user_attrs["prune_reason"]
    assert held not in r.completed
    assert db.get(VALID, B4K).params == held


def test_a_study_of_mostly_pruned_points_ends(tmp_path):
    """Static prunes are free, so a bucket where almost every point fails the rules would ask
    forever: the asks are capped at MAX_ASKS_PER_TRIAL per trial."""
    from fa2gen.tuner.study import MAX_ASKS_PER_TRIAL

    tiny = Bucket("fwd", "fp16", 64, "none", False, 1, 16, 16, 64)
    _, storage, _, [r] = _tune(tmp_path, [tiny], trials=12, sampler="brute")
    study = optuna.load_study(study_name=storage.get_all_studies()[0].study_name, storage=storage)
    assert r.trials < 12 <= len(study.get_trials()) <= MAX_ASKS_PER_TRIAL * 12 + 8


@pytest.mark.parametrize(
    "path", sorted((Path(__file__).parent.parent / "benchmarks" / "grids").glob("*.yaml")), ids=lambda p: p.name
)
def test_the_benchmark_grids_name_buckets_of_the_built_in_grids(path):
    # The GPU scripts tune these slices of the shipped buckets; one that parsed to nothing,
    # or to buckets outside the built-in grids, would tune what nothing dispatches.
    from fa2gen.tuner.grid import read_grid

    buckets = read_grid(path)
    assert buckets
    built_in = {b.key for b in default_buckets(("fwd", "bwd", "decode"))}
    fp8 = {b.key for b in buckets if b.dtype == "fp8e4m3"}
    assert {b.key for b in buckets} - fp8 <= built_in


class _FinishedMeanwhile(optuna.storages.RDBStorage):
    """Seam reproducing the race of two tuners sharing one SQLite study: just before this
    tuner writes a trial's result, a second connection (the other tuner) finishes it."""

    def set_trial_state_values(self, trial_id, state, values=None):
        if state.is_finished():
            other = optuna.storages.RDBStorage(self.url)
            if other.get_trial(trial_id).state == TrialState.RUNNING:
                other.set_trial_state_values(trial_id, TrialState.COMPLETE, [1.0])
        return super().set_trial_state_values(trial_id, state, values)


def test_a_trial_finished_by_another_tuner_meanwhile_keeps_the_first_result(tmp_path):
    from fa2gen.tuner.study import _tell

    storage = _FinishedMeanwhile(f"sqlite:///{tmp_path / 'race.db'}")
    study = optuna.create_study(study_name="race", storage=storage)
    trial = study.ask({"x": optuna.distributions.CategoricalDistribution([1, 2])})
    told = _tell(study, trial, 2.0)
    assert told.number == trial.number and told.state == TrialState.COMPLETE and told.value == 1.0
    # A trial only this tuner touches is written as told.
    plain = optuna.create_study(study_name="plain", storage=f"sqlite:///{tmp_path / 'plain.db'}")
    t = plain.ask({"x": optuna.distributions.CategoricalDistribution([1, 2])})
    assert _tell(plain, t, 2.0).value == 2.0


def test_decode_buckets_tune_store_and_dispatch(tmp_path, monkeypatch):
    """KV cache buckets (``--directions decode``): their own grid entries with a page size,
    their own space (pointer loads, the splits knob), and stored winners that
    attention_with_kvcache's lookup finds for a paged cache of the bucket, not a contiguous one."""
    from fa2gen.runtime.device import DeviceInfo
    from fa2gen.runtime.lookup import choose
    from fa2gen.runtime.problem import Problem

    decode = default_buckets(("decode",))
    assert len(decode) == 108 and {b.page for b in decode} == {0, 16}
    assert {(b.seqlen_q, b.mask) for b in decode} == {(1, "none"), (4, "causal"), (16, "causal")}
    bucket = Bucket("decode", "bf16", 128, "none", False, 4, 1, 8192, 256, 16)
    optimum = TuningParams(16, 128, 4, 2).replace(splits=8)
    db, storage, ev, [r] = _tune(tmp_path, [bucket], trials=25, evaluator=CostModelEvaluator(optimum=optimum))
    assert r.best is not None and {p.loads for p in ev.compiled} == {"pointer"}
    study = optuna.load_study(study_name=storage.get_all_studies()[0].study_name, storage=storage)
    assert len({t.params["splits"] for t in study.trials}) > 1  # the split count is searched
    first = TuningParams.from_dict(min(study.trials, key=lambda t: t.number).params)
    assert first == bucket_default(bucket, "sm90") and first.block_m == 16  # 1 token x a group of 4
    assert all(p.block_m <= 16 for p in ev.compiled)  # no taller tile than the packed rows
    assert db.get(VALID, bucket).params == r.best
    problem = Problem(
        batch=8,
        heads_q=32,
        heads_kv=8,
        seqlen_q=1,
        seqlen_k=6000,
        head_dim=128,
        dtype="bf16",
        mask="none",
        window_left=-1,
        window_right=-1,
        sm_scale=0.088,
        softcap=0.0,
        page_size=16,
    )
    device = DeviceInfo(name="TEST_GPU", capability=(9, 0), arch="sm90", sm_count=132)
    monkeypatch.setenv("FA2GEN_DB", str(tmp_path / "tuned.sqlite"))
    monkeypatch.setattr("fa2gen.runtime.lookup._validity", lambda dev: VALID)
    assert choose(problem, device, "decode").params == r.best
    contiguous = choose(dataclasses.replace(problem, page_size=0), device, "decode")
    assert contiguous.source == "default"  # a contiguous cache is another kernel


def test_a_paged_decode_study_measures_the_contiguous_winner(tmp_path):
    """A paged decode bucket's study measures its contiguous twin's winner right after the
    default, from this run's database (the grid tunes contiguous buckets first): the paged
    kernel runs the same tiles, and a study of three trials would not draw that point."""
    from fa2gen.tuner.run import contiguous_params

    contiguous = Bucket("decode", "bf16", 128, "none", False, 4, 1, 512, 64)
    paged = dataclasses.replace(contiguous, page=16)
    won = TuningParams(16, 64, 4, 3).replace(splits=2, combine="last")
    db = TunedDB(tmp_path / "tuned.sqlite")
    assert contiguous_params(db, VALID, paged, "sm90") == []
    db.put([_entry(VALID, contiguous, won, trials=48)])
    assert contiguous_params(db, VALID, paged, "sm90") == [won]
    assert contiguous_params(db, VALID, contiguous, "sm90") == []  # a contiguous bucket has no twin
    assert contiguous_params(db, Validity("OTHER_GPU", "9.0", "3.6.0"), paged, "sm90") == []
    _, storage, _, [r] = _tune(tmp_path, [paged], trials=3, evaluator=CostModelEvaluator(optimum=won))
    study = optuna.load_study(
        study_name=[s.study_name for s in storage.get_all_studies() if s.study_name.endswith(paged.key)][0],
        storage=storage,
    )
    first = [TuningParams.from_dict(t.params) for t in sorted(study.trials, key=lambda t: t.number)]
    assert first[:2] == [bucket_default(paged, "sm90"), won]
    assert r.best == won


def test_decode_grid_pages_and_representative_problem():
    [paged] = buckets_from_grid(
        {
            "problems": [
                {
                    "directions": ["decode"],
                    "seqlens_q": [1],
                    "seqlens_k": [5000],
                    "batch_heads": [8],
                    "groups": [4],
                    "head_dims": [128],
                    "masks": ["none"],
                    "dtypes": ["fp16"],
                    "pages": [24],
                }
            ]
        }
    )
    assert paged.key == "decode/fp16/d128/none/sc0/g4/q1/k8192/bh8/p32"
    s = representative_problem(paged)
    assert (s.page_size, s.seqlen_k, s.seqlen_q, s.heads_q // s.heads_kv) == (32, 8192, 1, 4)
    assert Bucket.of(s, "decode") == paged
    for bad in (
        {"pages": [16]},
        {"directions": ["decode"], "pages": [-16]},
        {"directions": ["decode"], "pages": [0.5]},
    ):
        with pytest.raises(GridError):
            buckets_from_grid({"problems": [bad]})


def test_varlen_buckets_tune_store_and_dispatch(tmp_path, monkeypatch):
    """Packed-batch buckets: their own grid entries and keys, a space of the varlen forms'
    choices only (pointer loads or the Gluon kernels' in-kernel descriptors, plain grid, dQ in
    its own kernel or the one pass), FLOPs of the sequences they are timed on, and stored winners that
    attention_varlen's lookup finds for a packed call of the bucket, never for a dense call of
    the same sizes."""
    from fa2gen.runtime.device import DeviceInfo
    from fa2gen.runtime.lookup import choose
    from fa2gen.tuner.evaluate import flops, varlen_lengths

    packed = [b for b in default_buckets(("fwd", "bwd")) if b.varlen]
    assert len(packed) == 32 and {b.direction for b in packed} == {"fwd", "bwd"}
    bucket = Bucket("bwd", "bf16", 128, "causal", False, 1, 2048, 2048, 128, varlen=True)
    assert bucket.key.endswith("/bh128/varlen") and Bucket.parse(bucket.key) == bucket
    assert varlen_lengths(bucket) == [512, 1024, 1536, 2048]
    assert flops(bucket) == pytest.approx(2.5 * sum(2 * 32 * n * n * 128 for n in (512, 1024, 1536, 2048)))
    optimum = TuningParams(64, 32, 4, 3)
    db, storage, ev, [r] = _tune(tmp_path, [bucket], trials=20, evaluator=CostModelEvaluator(optimum=optimum))
    assert r.best is not None and db.get(VALID, bucket).params == r.best
    # the Triton template's pointer loads, and the Gluon kernels' candidates (descriptors built in
    # them, dQ in its own kernel or, the one pass, added into sums): nothing else compiles, and
    # the space holds each form (which of them the sampler visits is its own business)
    forms = {
        ("pointer", "separate", 0, 0),
        ("tma_device", "separate", 1, 0),
        ("tma_device", "separate", 2, 0),
        ("tma_device", "atomic", 1, 0),
    }
    assert {(p.loads, p.dq_mode, p.gluon, p.persistent) for p in ev.compiled} <= forms
    assert {(p.loads, p.gluon) for p in ev.compiled} >= {("tma_device", 1), ("tma_device", 2)}
    space = space_for("sm90", "bwd", varlen=True)
    one_pass = TuningParams(128, 64, 8, 2, "tma_device", dq_mode="atomic", gluon=1)
    assert all(space.contains(p) for p in (optimum, TuningParams(64, 32, 4, 3, "tma_device", gluon=2), one_pass))
    problem = representative_problem(bucket)
    assert problem.varlen and problem.total_q == 5120 and Bucket.of(problem, "bwd") == bucket
    device = DeviceInfo(name="TEST_GPU", capability=(9, 0), arch="sm90", sm_count=132)
    monkeypatch.setenv("FA2GEN_DB", str(tmp_path / "tuned.sqlite"))
    monkeypatch.setattr("fa2gen.runtime.lookup._validity", lambda dev: VALID)
    assert choose(problem, device, "bwd").params == r.best
    dense = choose(dataclasses.replace(problem, varlen=False, total_q=0), device, "bwd")
    assert dense.params != r.best or dense.source != "tuned"  # a dense call is another kernel
    for bad in ("fwd/bf16/d128/causal/sc0/g1/q8/k8/bh8/p16/varlen", "decode/bf16/d128/none/sc0/g1/q1/k8/bh8/varlen"):
        with pytest.raises(SpecError):
            Bucket.parse(bad)


class _FaultAt(CostModelEvaluator):
    """Cost model whose ``n``-th measurement breaks the device, as an illegal memory access
    does (the real evaluator's ``_is_cuda_fault`` marks such errors fatal); ``measured``: the
    candidates it timed."""

    def __init__(self, n=None):
        super().__init__(optimum=OPTIMUM)
        self.n, self.faulted, self.measured = n, None, []

    def measure(self, bucket, params):
        if self.calls + 1 == self.n:
            self.calls += 1
            self.faulted = params
            raise Rejected("RuntimeError: CUDA error: an illegal memory access was encountered", fatal=True)
        self.measured.append(params)
        return super().measure(bucket, params)


@pytest.mark.parametrize(
    "message, fatal",
    [
        ("CUDA error: an illegal memory access was encountered", True),
        ("CUDA error: unspecified launch failure", True),
        ("Triton Error [CUDA]: an illegal memory access was encountered", True),
        ("out of resource: shared memory, Required: 262144, Hardware limit: 232448", False),
        ("CUDA out of memory. Tried to allocate 2.00 GiB", False),
    ],
)
def test_which_errors_break_the_device(message, fatal):
    from fa2gen.tuner.evaluate import _is_cuda_fault

    assert _is_cuda_fault(RuntimeError(message)) is fatal


def test_a_device_fault_stops_the_run_and_the_resume_skips_its_candidate(tmp_path):
    # A candidate that breaks the CUDA context stops the run (every later measurement would
    # fail and prune good candidates); it is pruned for good, its round's other trials are
    # queued again, and the resumed run never measures a finished trial again.
    from fa2gen.tuner.evaluate import DeviceFault
    from fa2gen.tuner.study import tune_bucket

    storage = open_storage(f"sqlite:///{tmp_path / 's.sqlite'}")
    space = space_for("sm90")
    faulty = _FaultAt(5)
    with pytest.raises(DeviceFault, match="illegal memory access"):
        tune_bucket(B4K, faulty, space, storage=storage, name_prefix="t", trials=24, batch=8)
    study = optuna.load_study(study_name=storage.get_all_studies()[0].study_name, storage=storage)
    reasons = [t.user_attrs.get("prune_reason", "") for t in study.get_trials(states=(TrialState.PRUNED,))]
    assert sum("illegal memory access" in r for r in reasons) == 1
    assert study.get_trials(states=(TrialState.FAIL,)), "the round's other trials were not queued again"
    assert faulty.faulted is not None and len(faulty.measured) == 4
    resumed = _FaultAt()
    r = tune_bucket(B4K, resumed, space, storage=storage, name_prefix="t", trials=24, batch=8)
    assert r.trials == 24 and r.best is not None
    assert faulty.faulted not in resumed.measured
    assert not set(faulty.measured) & set(resumed.measured)


@pytest.mark.parametrize(
    "kind",
    ["unclosed", "unsafe-tag", "fifo", "directory", "not-a-mapping", "unknown-key"],
)
def test_a_broken_grid_file_is_one_line(tmp_path, kind):
    from fa2gen.tuner.grid import read_grid

    path = tmp_path / "grid.yaml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_text(
            {
                "unclosed": "problems: [\n",
                "unsafe-tag": "!!python/object/apply:os.system ['echo pwned']\n",
                "not-a-mapping": "- 1\n- 2\n",
                "unknown-key": "problems:\n  - dtypes: [bf16]\n    heads: [4]\n",
            }[kind]
        )
    with pytest.raises(GridError) as raised:
        read_grid(path)
    assert len(str(raised.value).splitlines()) == 1, str(raised.value)
