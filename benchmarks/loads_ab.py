"""A/B of the three load paths (pointer, in-kernel descriptors, host descriptors).

On every fp16 cell of the FlashAttention-2 grid, with the default tiles, times the
call as attention() makes it (validation + launch, so host cost counts) and as a
CUDA-graph replay (GPU time alone). Also sweeps a few tiles at head_dim 256, whose
default is otherwise unmeasured. Prints a table; writes JSON to argv[1].
"""

from __future__ import annotations

import json
import math
import sys

import torch

from fa2gen.bench.grid import canonical_grid, make_inputs, Case
from fa2gen.bench.timing import measure, warm_gpu
from fa2gen.generator.spec import TuningParams
from fa2gen.runtime.device import cuda_device_info
from fa2gen.runtime.dispatch import select_params
from fa2gen.runtime.launch import forward
from fa2gen.runtime.problem import make_problem

sys.path.insert(0, "benchmarks")
from overhead import graph_time  # noqa: E402

LOADS = ("pointer", "tma_device", "tma_host")


def main(out_path: str) -> None:
    rows = []
    dev = torch.device("cuda")
    for case in canonical_grid(dtypes=("fp16",)):
        q, k, v = make_inputs(case, dev)
        base = select_params(make_problem(q, k, v, causal=case.causal), cuda_device_info(torch.cuda.current_device()))
        row = {"cell": case.label(), "e2e": {}, "graph": {}}
        for loads in LOADS:
            p = base.replace(loads=loads)
            call = lambda: forward(q, k, v, make_problem(q, k, v, causal=case.causal), p)  # noqa: E731
            warm_gpu()
            row["e2e"][loads] = round(case.flops() / measure(call).median_ms / 1e9, 1)
            row["graph"][loads] = round(case.flops() / graph_time(call) / 1e9, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    d256 = []
    for causal in (False, True):
        case = Case(4, 8, 4096, 256, causal, "fp16")
        q, k, v = make_inputs(case, dev)
        pr = make_problem(q, k, v, causal=causal)
        for bm, bn, w, s in ((64, 64, 4, 2), (64, 32, 4, 2), (64, 64, 8, 2), (128, 64, 8, 2), (128, 32, 8, 2), (64, 32, 4, 3)):
            for loads in ("tma_device", "tma_host"):
                p = TuningParams(bm, bn, w, s, loads)
                try:
                    tf = round(case.flops() / graph_time(lambda: forward(q, k, v, pr, p)) / 1e9, 1)
                except Exception as e:  # out of resources is a result here
                    tf = f"{type(e).__name__}"
                d256.append({"causal": causal, "params": p.to_dict(), "tflops": tf})
    with open(out_path, "w") as f:
        json.dump({"cells": rows, "d256": d256}, f, indent=1)
    gm = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))  # noqa: E731
    for kind in ("e2e", "graph"):
        print(kind, {ld: round(gm([r[kind][ld] for r in rows]), 1) for ld in LOADS})
    for r in rows:
        print(f"{r['cell']:38s}", " ".join(f"{r['e2e'][ld]:6}" for ld in LOADS), "|", " ".join(f"{r['graph'][ld]:6}" for ld in LOADS))
    for r in d256:
        print("D256", r)


if __name__ == "__main__":
    main(sys.argv[1])
