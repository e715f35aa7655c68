"""Where the time goes on short problems: host overhead versus kernel time.

For the short canonical cells, times fa2gen.attention() end to end and as a CUDA-graph
replay (pure GPU time), and the host cost of one call three ways: attention(),
forward() (launch without validation and dispatch) and the bare Triton launch of the
same kernel (``jit_launch``: Triton's dispatch and launcher only). Then a handful of tile
configs, end to end and by graph replay, to choose the defaults of short cells. Writes JSON and prints a table.

usage: python benchmarks/overhead.py OUT.json
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
from fa2gen.runtime.launch import Launch, forward
from fa2gen.runtime.problem import make_problem

CELLS = [
    (64, False, 512),
    (64, True, 512),
    (128, False, 512),
    (128, True, 512),
    (64, True, 1024),
    (128, False, 1024),
    (128, True, 1024),
    (128, True, 2048),
]
CONFIGS = [
    TuningParams(64, 128, 4, 2, "tma_host"),
    TuningParams(128, 64, 4, 2, "tma_host"),
    TuningParams(64, 64, 4, 2, "tma_host"),
    TuningParams(64, 64, 4, 3, "tma_host"),
    TuningParams(64, 32, 4, 3, "tma_host"),
    TuningParams(128, 32, 4, 3, "tma_host"),
    TuningParams(64, 64, 4, 3, "pointer"),
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


def jit_launch(q, k, v, problem, params):
    """The same tma_host kernel launched by hand through Triton: the floor that fa2gen's
    per-call work sits on."""
    launch = Launch(problem, params)
    out = torch.empty_like(q)
    lse = torch.empty((problem.batch, problem.heads_q, problem.seqlen_q), device=q.device, dtype=torch.float32)
    kernel, args, options = launch.prepared(q, k, v, out, lse)
    kernel[launch.grid](*args, **options)
    return out


def main(out_path):
    rows = []
    for d, causal, n in CELLS:
        case = Case(16384 // n, 2048 // d, n, d, causal, "fp16")
        q, k, v = make_inputs(case, torch.device("cuda"))
        pr = make_problem(q, k, v, causal=causal)
        params = select_params(pr, cuda_device_info(torch.cuda.current_device()))

        def tf(ms, case=case):
            return round(case.flops() / ms / 1e9, 1)

        def call(q=q, k=k, v=v, causal=causal):
            return fa2gen.attention(q, k, v, causal=causal)

        row = {
            "cell": case.label(),
            "default": params.to_dict(),
            "e2e": tf(measure(call).median_ms),
            "graph": tf(graph_time(call)),
            "host_us_attention": round(host_us(call), 1),
            "host_us_forward": round(host_us(lambda: forward(q, k, v, pr, params)), 1),
            "configs_e2e": {},
            "configs_graph": {},
        }
        if params.loads == "tma_host":
            row["host_us_jit"] = round(host_us(lambda: jit_launch(q, k, v, pr, params)), 1)
            row["e2e_jit"] = tf(measure(lambda: jit_launch(q, k, v, pr, params)).median_ms)
        for p in CONFIGS:
            name = f"{p.loads[0]}m{p.block_m}n{p.block_n}w{p.num_warps}s{p.num_stages}"
            try:
                row["configs_e2e"][name] = tf(measure(lambda: forward(q, k, v, pr, p)).median_ms)
                row["configs_graph"][name] = tf(graph_time(lambda: forward(q, k, v, pr, p)))
            except Exception as e:  # a config that does not fit this cell is data too
                row["configs_e2e"][name] = str(e)[:80]
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(out_path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    print(f"{'cell':40s} {'e2e':>6} {'e2e_jit':>7} {'graph':>6} {'host_att':>8} {'host_fwd':>8} {'host_jit':>8}")
    for r in rows:
        print(
            f"{r['cell']:40s} {r['e2e']:6} {r.get('e2e_jit', '-'):7} {r['graph']:6} {r['host_us_attention']:8} "
            f"{r['host_us_forward']:8} {r.get('host_us_jit', '-'):8}"
        )
    for r in rows:
        best = sorted(((v, k) for k, v in r["configs_e2e"].items() if isinstance(v, float)), reverse=True)[:3]
        print(f"{r['cell']:40s} best e2e: {best}")


if __name__ == "__main__":
    main(sys.argv[1])
