"""The backward's ways to compute dQ, compared from the tuner's own studies.

A backward study whose space holds several dQ modes starts with the default's tiles once
in each (see fa2gen.tuner.run), so each bucket holds a same-tiles A/B of the modes, plus
whatever else the sampler tried in each. (The sm90 space searches one mode since the
H200 measurement in benchmarks/results/dq-modes-h200.md: its later studies have no A/B.) This reads one or more Optuna storages and prints, per bucket,
the same-tiles TFLOP/s of each mode and the best TFLOP/s each mode reached, then geomeans of
each mode against "separate". Markdown on stdout; --json writes the numbers.

usage: python benchmarks/dq_modes.py sqlite:///studies-fp16.sqlite [more storages] [--json F]
"""

from __future__ import annotations

import argparse
import json
import math

import optuna

MODES = ("separate", "atomic", "tma_reduce")
_TILE_KEYS = ("block_m", "block_n", "num_warps", "num_stages")


def _bucket(study_name: str) -> str:
    return study_name.rsplit("|", 1)[-1]


def bucket_rows(storage: str) -> list[dict]:
    rows = []
    for summary in optuna.get_all_study_summaries(storage):
        bucket = _bucket(summary.study_name)
        if not bucket.startswith("bwd/"):
            continue
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE and "tflops" in t.user_attrs]
        if not done:
            continue
        best = {m: max((t.user_attrs["tflops"] for t in done if t.params.get("dq_mode") == m), default=None)
                for m in MODES}
        # The warm-start twins: the default's tiles (the first trial enqueued, whatever
        # became of it) in every mode.
        first = study.trials[0].params
        if not all(k in first for k in _TILE_KEYS):
            continue
        tiles = tuple(first[k] for k in _TILE_KEYS)
        same = {}
        for t in done:
            m = t.params.get("dq_mode")
            if tuple(t.params[k] for k in _TILE_KEYS) == tiles and m not in same:
                same[m] = t.user_attrs["tflops"]
        winner = max(done, key=lambda t: t.user_attrs["tflops"])
        rows.append({"bucket": bucket, "tiles": "m{} n{} w{} s{}".format(*tiles), "same_tiles": same,
                     "best": best, "winner": winner.params.get("dq_mode"), "trials": len(done)})
    return sorted(rows, key=lambda r: r["bucket"])


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.0f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("storages", nargs="+", help="Optuna storage URLs")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rows = [r for s in args.storages for r in bucket_rows(s)]
    print("| bucket | twin tiles | same tiles: separate / atomic / tma_reduce | best: separate / atomic / tma_reduce | winner |")
    print("|---|---|---|---|---|")
    for r in rows:
        same = " / ".join(_fmt(r["same_tiles"].get(m)) for m in MODES)
        best = " / ".join(_fmt(r["best"][m]) for m in MODES)
        print(f"| {r['bucket']} | {r['tiles']} | {same} | {best} | {r['winner']} |")
    print()
    for m in MODES[1:]:
        same = [r["same_tiles"][m] / r["same_tiles"]["separate"] for r in rows
                if r["same_tiles"].get(m) and r["same_tiles"].get("separate")]
        best = [r["best"][m] / r["best"]["separate"] for r in rows if r["best"][m] and r["best"]["separate"]]
        wins = sum(r["winner"] == m for r in rows)
        print(f"{m} / separate: same tiles geomean {_geomean(same):.3f} over {len(same)} buckets "
              f"(range {min(same, default=float('nan')):.2f}-{max(same, default=float('nan')):.2f}); "
              f"best of each geomean {_geomean(best):.3f}; wins {wins}/{len(rows)} buckets")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
