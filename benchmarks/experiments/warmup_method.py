"""Probe: how the warm-up before each timing window moves fp8's and bf16's numbers.

The bench timed each provider in rounds, each window after 100 ms of fp16 matmuls
(fa2gen.bench.timing.warm_gpu; since this probe, after the provider's own calls). The first
full run of the tables that way read the fp8 forward 7-13% slower than the one-window tables,
fa2gen's bf16 4-5% and cuDNN 5-8% (perf-notes, "Every table timed in rounds, each window after
100 ms of matmuls"). This times the same cells three ways, each in rounds in one run:
- gemm: 100 ms of fp16 matmuls, then do_bench's 10 ms warm-up and 50 ms window (the bench's
  window before this probe);
- own: 100 ms of the provider's own calls, then the same do_bench window (the bench's since);
- long: do_bench's 25 ms warm-up and 100 ms of runs, nothing before (the one-window
  method's window, here taken in rounds).
Providers: fa2gen on fp8, fa2gen on the same values in bf16, SDPA cuDNN in bf16.

usage: python benchmarks/experiments/warmup_method.py [--seqlens 4096,16384] [--out warmup.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from fa2gen.bench.grid import Case, make_inputs
from fa2gen.bench.providers import PROVIDERS
from fa2gen.bench.timing import time_in_rounds, warm_gpu, warm_window


def gemm_window(fn) -> list[float]:
    from triton.testing import do_bench

    warm_gpu()
    return do_bench(fn, warmup=10, rep=50, return_mode="all")


def long_window(fn) -> list[float]:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="all")


WINDOWS = {"gemm": gemm_window, "own": warm_window, "long": long_window}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlens", default="4096,16384")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for causal in (False, True):
        for n in map(int, args.seqlens.split(",")):
            case = Case(max(1, 16384 // n), 16, n, 128, causal, "fp8e4m3")
            q, k, v = make_inputs(case, torch.device("cuda"))
            wide = tuple(t.to(torch.bfloat16) for t in (q, k, v))
            calls = {name: PROVIDERS[name].build(case, *((q, k, v) if PROVIDERS[name].takes_fp8 else wide))
                     for name in ("fa2gen", "fa2gen-bf16", "sdpa-cudnn")}
            for fn in calls.values():
                fn()
            torch.cuda.synchronize()
            row = {"case": case.label(), "tflops": {}}
            for method, window in WINDOWS.items():
                timed = time_in_rounds(calls, window)
                row["tflops"][method] = {name: case.flops() / (t[1] * 1e-3) / 1e12 for name, t in timed.items()}
            rows.append(row)
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(rows, f, indent=1)
            for method, t in row["tflops"].items():
                print(f"{case.label():36s} {method:5s} " + " ".join(f"{k} {v:5.0f}" for k, v in t.items())
                      + f"  fp8/bf16 {t['fa2gen'] / t['fa2gen-bf16']:.3f}  bf16/cuDNN {t['fa2gen-bf16'] / t['sdpa-cudnn']:.3f}",
                      flush=True)


if __name__ == "__main__":
    main()
