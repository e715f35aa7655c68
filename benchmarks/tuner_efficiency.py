"""How many TPE trials reach within 2% of the exhaustive best?

For each bucket: measure every point of the sm90 space once (static pruning first,
compiles in parallel), then replay TPE against that table with several seeds and count
the trials (finished ones as --trials counts them, and measured ones) until the best so far is within
2% of the exhaustive best. Replaying spends no GPU time per seed, and every seed sees
the same numbers. Writes JSON and prints a table.

GPU:  python benchmarks/tuner_efficiency.py --out eff.json
CPU dry run of the procedure (cost model instead of timing): add --cost-model
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import optuna
from optuna.trial import TrialState

from fa2gen.generator.spec import TuningParams
from fa2gen.runtime.defaults import bucket_default
from fa2gen.store.buckets import Bucket
from fa2gen.store.records import Measurement
from fa2gen.tuner.evaluate import CostModelEvaluator, Rejected
from fa2gen.tuner.space import prune_reason, space_for
from fa2gen.tuner.study import STATIC, tune_bucket

BUCKETS = (
    "fwd/fp16/d128/none/sc0/g1/q4096/k4096/bh64",
    "fwd/fp16/d64/causal/sc0/g1/q1024/k1024/bh512",
    "fwd/bf16/d128/causal/sc0/g1/q16384/k16384/bh16",
)


class Replay:
    """Answers from an exhaustive table: the evaluator TPE is replayed against."""

    def __init__(self, table: dict[TuningParams, Measurement | str]):
        self.table = table

    def compile(self, bucket, candidates):
        return {p: self.table[p] if isinstance(self.table.get(p), str) else None for p in candidates}

    def measure(self, bucket, params):
        m = self.table[params]
        if isinstance(m, str):
            raise Rejected(m)
        return m


def exhaustive(bucket: Bucket, evaluator, space) -> dict:
    spec = bucket.kernel_spec()
    points = [
        TuningParams(**dict(zip(space.choices(), values)))
        for values in __import__("itertools").product(*space.choices().values())
    ]
    table: dict[TuningParams, Measurement | str] = {}
    valid = []
    for p in points:
        why = prune_reason(space, spec, bucket, p)
        if why:
            table[p] = f"pruned: {why}"
        else:
            valid.append(p)
    for p, why in evaluator.compile(bucket, valid).items():
        if why:
            table[p] = why
            continue
        try:
            table[p] = evaluator.measure(bucket, p)
        except Rejected as e:
            table[p] = e.reason
    return table


def trials_to_target(bucket, table, space, seed, max_trials, target_ms):
    storage = optuna.storages.InMemoryStorage()
    tune_bucket(
        bucket,
        Replay(table),
        space,
        storage=storage,
        name_prefix="eff",
        trials=max_trials,
        seed=seed,
        default=bucket_default(bucket, space.arch),
    )
    study = optuna.load_study(study_name=storage.get_all_studies()[0].study_name, storage=storage)
    # Trials as --trials counts them: decided ones, less those the static rules pruned.
    best, finished, measured = float("inf"), 0, 0
    for t in sorted(study.get_trials(), key=lambda t: t.number):
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and not t.user_attrs.get(STATIC):
            finished += 1
        if t.state == TrialState.COMPLETE:
            measured += 1
            best = min(best, t.value)
        if best <= 1.02 * target_ms:
            return finished, measured
    return None, measured


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--buckets", default=",".join(BUCKETS))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--max-trials", type=int, default=120)
    ap.add_argument("--cost-model", action="store_true", help="dry run on CPU with the cost model")
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = space_for("sm90")
    if args.cost_model:
        evaluator = CostModelEvaluator(TuningParams(64, 32, 4, 3, "tma_device"))
    else:
        from fa2gen.tuner.evaluate import GpuEvaluator

        evaluator = GpuEvaluator()
    rows = []
    try:
        for key in args.buckets.split(","):
            bucket = Bucket.parse(key)
            t0 = time.time()
            table = exhaustive(bucket, evaluator, space)
            wall = time.time() - t0
            ok = {p: m for p, m in table.items() if isinstance(m, Measurement)}
            best_p = min(ok, key=lambda p: ok[p].median_ms)
            best = ok[best_p].median_ms
            runs = [trials_to_target(bucket, table, space, s, args.max_trials, best) for s in range(args.seeds)]
            reached = [r for r in runs if r[0] is not None]
            rows.append(
                {
                    "bucket": key,
                    "space": space.size(),
                    "valid": len(ok),
                    "exhaustive_wall_s": round(wall, 1),
                    "best": best_p.to_dict(),
                    "best_ms": best,
                    "best_tflops": ok[best_p].tflops,
                    "trials_to_2pct": [r[0] for r in runs],
                    "measured_to_2pct": [r[1] for r in runs],
                    "median_trials": statistics.median(r[0] for r in reached) if reached else None,
                    "median_measured": statistics.median(r[1] for r in reached) if reached else None,
                    "table": {
                        json.dumps(p.to_dict(), sort_keys=True): (m.median_ms if isinstance(m, Measurement) else m)
                        for p, m in table.items()
                    },
                }
            )
            with open(args.out, "w") as f:  # after each bucket: a cut-off run keeps what it measured
                json.dump(rows, f, indent=1)
            print(
                f"{key}: {len(ok)}/{space.size()} valid, exhaustive {wall:.0f}s, best {best:.4f} ms "
                f"{best_p.to_dict()}; trials to 2%: {rows[-1]['trials_to_2pct']}",
                flush=True,
            )
    finally:
        if hasattr(evaluator, "close"):
            evaluator.close()
    print(f"{'bucket':50s} valid  median trials (finished / measured) to within 2%")
    for r in rows:
        print(f"{r['bucket']:50s} {r['valid']:5d}  {r['median_trials']} / {r['median_measured']}")


if __name__ == "__main__":
    main()
