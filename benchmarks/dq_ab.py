"""A/B of the backward's ways to compute dQ: its own kernel (recomputing the scores), or
added from the dK/dV kernel into fp32 (two matmuls fewer per block pair) by per-element
atomics or by one bulk reduction per tile through a host descriptor.

On every cell of the FlashAttention-2 grid (one dtype), times the backward alone with the
config attention() would dispatch, the same tiles each other way, and a few tiles that suit
the summing paths (longer loop steps halve the additions per FLOP). Writes JSON to
--out after each cell and prints a table with geomeans last.

usage: python benchmarks/dq_ab.py --out dq-ab.json [--dtype fp16]
"""

from __future__ import annotations

import argparse
import json
import math

import torch

from fa2gen.bench.grid import canonical_grid, make_inputs
from fa2gen.bench.timing import measure, warm_gpu
from fa2gen.generator.arch import fits
from fa2gen.generator.spec import TuningParams
from fa2gen.runtime.backward import backward
from fa2gen.runtime.device import cuda_device_info
from fa2gen.runtime.dispatch import select_params
from fa2gen.runtime.launch import forward
from fa2gen.runtime.problem import make_problem

ATOMIC_TILES = [
    TuningParams(128, 64, 8, 2, "pointer", "atomic"),
    TuningParams(128, 64, 8, 2, "tma_host", "tma_reduce"),
    TuningParams(64, 64, 4, 2, "tma_host", "tma_reduce"),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="fp16")
    args = ap.parse_args()
    dev = torch.device("cuda")
    info = cuda_device_info(torch.cuda.current_device())
    rows = []
    for case in canonical_grid(dtypes=(args.dtype,)):
        q, k, v = make_inputs(case, dev)
        problem = make_problem(q, k, v, causal=case.causal)
        out, lse = forward(q, k, v, problem, select_params(problem, info))
        dout = torch.randn_like(out)
        base = select_params(problem, info, "bwd")
        variants = {"dispatched": base, "same tiles, atomic": base.replace(dq_mode="atomic"),
                    "same tiles, tma_reduce": base.replace(dq_mode="tma_reduce", loads="tma_host")}
        variants.update({p.label(): p for p in ATOMIC_TILES})
        row = {"cell": case.label(), "dispatched": base.to_dict(), "tflops": {}}
        for name, params in variants.items():
            why = fits(problem.kernel_spec("bwd"), params, info.arch)
            if why:
                row["tflops"][name] = f"does not fit: {why}"
                continue
            warm_gpu()
            ms = measure(lambda: backward(q, k, v, out, lse, dout, problem, params)).median_ms
            row["tflops"][name] = round(2.5 * case.flops() / ms / 1e9, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "dtype": args.dtype, "cells": rows}, f, indent=1)
    names = list(rows[0]["tflops"])
    print(f"{'cell':38s}" + "".join(f"{n[:24]:>26s}" for n in names))
    for r in rows:
        print(f"{r['cell']:38s}" + "".join(f"{str(r['tflops'][n]):>26s}" for n in names))
    for n in names[1:]:
        ratios = [r["tflops"][n] / r["tflops"]["dispatched"] for r in rows if isinstance(r["tflops"][n], float)]
        if ratios:
            gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
            print(f"geomean {n} / dispatched: {gm:.3f} over {len(ratios)} cells, best {max(ratios):.2f}")


if __name__ == "__main__":
    main()
