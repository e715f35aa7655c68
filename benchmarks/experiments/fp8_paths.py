"""Experiment: where an fp8 forward's time goes at canonical-grid shapes (D=128, non-causal):
the transposed copy of V alone, the whole call with the default config, the kernel alone on
a V staged beforehand, and a few other tiles and load paths. Outputs are checked first.

usage: python benchmarks/experiments/fp8_paths.py [--seqlens 4096,16384]
"""

from __future__ import annotations

import argparse

import torch

from fa2gen.bench.correctness import check_forward
from fa2gen.bench.grid import Case, make_inputs
from fa2gen.bench.timing import measure
from fa2gen.generator.spec import TuningParams
from fa2gen.runtime.device import cuda_device_info
from fa2gen.runtime.dispatch import select_params
from fa2gen.runtime.fp8 import check_descales, transposed_v
from fa2gen.runtime.launch import Launch, forward
from fa2gen.runtime.problem import make_problem

TILES = [(128, 64, 4, 2, "tma_host"), (128, 64, 4, 2, "tma_device"), (128, 128, 8, 2, "tma_host"),
         (128, 128, 8, 3, "tma_host"), (128, 256, 8, 2, "tma_host"), (128, 128, 4, 2, "tma_host"),
         (128, 64, 4, 3, "tma_host"), (256, 128, 8, 2, "tma_host")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlens", default="4096,16384")
    args = ap.parse_args()
    for n in map(int, args.seqlens.split(",")):
        case = Case(max(1, 16384 // n), 16, n, 128, False, "fp8e4m3")
        q, k, v = make_inputs(case, torch.device("cuda"))
        problem = make_problem(q, k, v)
        descales = check_descales(problem, q.device, None, None, None)
        flops = case.flops()
        ms = measure(lambda: transposed_v(v)).median_ms
        print(f"{case.label()}: V transposed alone {ms * 1e3:.1f} us", flush=True)
        default = select_params(problem, cuda_device_info(0))
        for params in [default] + [TuningParams(*t) for t in TILES]:
            try:
                out, lse = forward(q, k, v, problem, params, descales=descales)
                verdict = check_forward(q, k, v, problem, out, lse, descales=descales)
                whole = measure(lambda: forward(q, k, v, problem, params, descales=descales)).median_ms
                launch = Launch(problem, params)
                vt = launch.staged_v(v)
                out = torch.empty(q.shape, device="cuda", dtype=torch.bfloat16)
                fn, args, options = launch.prepared(q, k, vt, out, lse, descales)
                kernel = measure(lambda: fn[launch.grid](*args, **options)).median_ms
                print(f"  {params.label():32s} call {flops / whole / 1e9:6.1f}  kernel {flops / kernel / 1e9:6.1f} "
                      f"TFLOP/s  {verdict}", flush=True)
            except Exception as e:  # a tile that fails to compile or fit is a result here
                print(f"  {params.label():32s} failed: {type(e).__name__}: {str(e)[:100]}", flush=True)


if __name__ == "__main__":
    main()
