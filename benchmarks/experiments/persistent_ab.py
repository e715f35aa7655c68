"""Experiment: persistent forward grids against one program per tile, at the config dispatch
picks for each cell (the shipped tuned entry, or the default), with only `persistent` changed.
Outputs are checked before any timing.

usage: python benchmarks/experiments/persistent_ab.py [--dtypes fp16,fp8e4m3] [--seqlens 1024,4096,16384]
                                                      [--out persistent-ab.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import torch

from fa2gen.bench.correctness import check_forward
from fa2gen.bench.grid import Case, make_inputs
from fa2gen.bench.timing import measure
from fa2gen.generator.spec import PERSISTENT
from fa2gen.runtime.device import cuda_device_info
from fa2gen.runtime.dispatch import select_params
from fa2gen.runtime.launch import Launch, forward
from fa2gen.runtime.problem import make_problem


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="fp16,fp8e4m3")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--seqlens", default="1024,4096,16384")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for dtype in args.dtypes.split(","):
        for d in map(int, args.head_dims.split(",")):
            for n in map(int, args.seqlens.split(",")):
                for causal in (False, True):
                    case = Case(max(1, 16384 // n), 2048 // d, n, d, causal, dtype)
                    q, k, v = make_inputs(case, torch.device("cuda"))
                    problem = make_problem(q, k, v, causal=causal)
                    base = select_params(problem, cuda_device_info(0))
                    row = {"case": case.label(), "params": base.label(), "tflops": {}}
                    for p in PERSISTENT:
                        params = dataclasses.replace(base, persistent=p)
                        try:
                            launch = Launch(problem, params)
                            out = torch.full(q.shape, float("nan"), device="cuda",
                                             dtype=torch.bfloat16 if problem.kernel_spec().fp8 else q.dtype)
                            out, lse = forward(q, k, v, problem, params, out=out, launch=launch)
                            verdict = check_forward(q, k, v, problem, out, lse)
                        except Exception as e:  # a variant that fails to compile or launch is a result here
                            row["tflops"][p] = None
                            print(f"{case.label()} persistent{p}: failed: {type(e).__name__}: {str(e)[:100]}",
                                  flush=True)
                            continue
                        if not verdict.ok:
                            row["tflops"][p] = None
                            print(f"{case.label()} persistent{p}: WRONG {verdict}", flush=True)
                            continue
                        ms = measure(lambda: forward(q, k, v, problem, params, launch=launch)).median_ms
                        row["tflops"][p] = case.flops() / ms / 1e9
                    rows.append(row)
                    if args.out:  # after each cell, so that a run cut short keeps what it measured
                        with open(args.out, "w") as f:
                            json.dump(rows, f, indent=1)
                    t = row["tflops"]
                    ratios = "  ".join(f"p{p}/p0 {t[p] / t[0]:.3f}" if t.get(p) and t.get(0) else f"p{p} -"
                                       for p in PERSISTENT[1:])
                    print(f"{case.label():42s} {row['params']:28s} p0 {t.get(0) or 0:6.1f}  {ratios}", flush=True)
    for causal in ("full", "causal"):
        for p in PERSISTENT[1:]:
            rs = [r["tflops"][p] / r["tflops"][0] for r in rows
                  if causal in r["case"] and r["tflops"].get(p) and r["tflops"].get(0)]
            if rs:
                print(f"geomean persistent{p} / plain, {causal}: {torch.tensor(rs).log().mean().exp().item():.3f} "
                      f"(min {min(rs):.3f}, max {max(rs):.3f}, {len(rs)} cells)")


if __name__ == "__main__":
    main()
