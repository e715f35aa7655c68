"""Where the time goes on short problems: host overhead versus kernel time.

For a few small canonical cells, times fa2gen.attention() end to end, the launch
without validation/dispatch, a CUDA-graph replay (pure GPU time) and the host cost
of one call, then a handful of tile configs by graph replay. Prints a table.
"""

from __future__ import annotations

import json
import sys
import time

import torch

import fa2gen
from fa2gen.bench.grid import Case, make_inputs
from fa2gen.bench.timing import measure
from fa2gen.generator.spec import TuningParams
from fa2gen.runtime.device import cuda_device_info
from fa2gen.runtime.dispatch import select_params
from fa2gen.runtime.launch import forward
from fa2gen.runtime.problem import make_problem

CELLS = [(64, True, 512), (64, False, 1024), (64, True, 1024), (128, True, 512), (128, False, 512), (64, False, 4096)]
CONFIGS = [
    TuningParams(64, 128, 4, 2, "tma_host"), TuningParams(128, 64, 4, 2, "tma_host"), TuningParams(128, 128, 8, 2, "tma_host"),
    TuningParams(64, 64, 4, 2, "tma_host"), TuningParams(128, 64, 8, 3, "pointer"), TuningParams(64, 64, 4, 3, "pointer"),
    TuningParams(128, 32, 4, 3, "tma_host"), TuningParams(64, 32, 4, 3, "tma_host"),
]


def graph_time(fn):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return measure(g.replay).median_ms


def host_us(fn, n=300):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def main(out_path):
    rows = []
    for d, causal, n in CELLS:
        case = Case(16384 // n, 2048 // d, n, d, causal, "fp16")
        q, k, v = make_inputs(case, torch.device("cuda"))
        pr = make_problem(q, k, v, causal=causal)
        params = select_params(pr, cuda_device_info(torch.cuda.current_device()))
        tf = lambda ms: round(case.flops() / ms / 1e9, 1)
        row = {
            "cell": case.label(),
            "e2e": tf(measure(lambda: fa2gen.attention(q, k, v, causal=causal)).median_ms),
            "direct": tf(measure(lambda: forward(q, k, v, pr, params)).median_ms),
            "graph": tf(graph_time(lambda: fa2gen.attention(q, k, v, causal=causal))),
            "host_us_attention": round(host_us(lambda: fa2gen.attention(q, k, v, causal=causal)), 1),
            "host_us_forward": round(host_us(lambda: forward(q, k, v, pr, params)), 1),
            "host_us_forward_pointer": round(host_us(lambda: forward(q, k, v, pr, params.replace(loads="pointer"))), 1),
            "host_us_forward_tma": round(host_us(lambda: forward(q, k, v, pr, params.replace(loads="tma_host"))), 1),
            "configs": {},
        }
        for p in CONFIGS:
            try:
                row["configs"][f"{p.loads[0]}m{p.block_m}n{p.block_n}w{p.num_warps}s{p.num_stages}"] = tf(
                    graph_time(lambda: forward(q, k, v, pr, p)))
            except Exception as e:
                row["configs"][str(p)] = str(e)[:80]
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(out_path, "w") as f:
        json.dump(rows, f, indent=1)
    print(f"{'cell':40s} e2e direct graph host_att host_fwd host_ptr host_tma")
    for r in rows:
        print(f"{r['cell']:40s} {r['e2e']:6} {r['direct']:6} {r['graph']:6} {r['host_us_attention']:6} "
              f"{r['host_us_forward']:6} {r['host_us_forward_pointer']:6} {r['host_us_forward_tma']:6}")


if __name__ == "__main__":
    main(sys.argv[1])
