"""dq_mode "matmul" under a causal mask (perf-notes v38): how many bands of queries, on which tiles.

For each causal cell of the canonical grid at D=128 (and D=64 N=4k): the shipped backward (the
tuned configs), and dq_mode matmul on 64 x 64 (two stages) and 64 x 32 (three stages) dK/dV
tiles with dQ's matmul in 1 to 32 bands (at least 128 queries each). Each is checked by
flash-attention's rule against an fp32 reference (outputs poisoned with NaN first) on a
sub-batch, then timed with do_bench (L2 flushed, median) next to SDPA cuDNN's backward in the
same process; the matmul forms' kernels come from the PyTorch profiler (attn_bwd_dkdv; nvjet:
cuBLAS's dQ matmuls; elementwise: the zeroing of skipped tiles and dQ's copy out of fp32).

usage: python benchmarks/experiments/causal_bands.py --out OUT.json [--dtype fp16]
"""

from __future__ import annotations

import argparse
import json

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import fa2gen.runtime.backward as bwd
from fa2gen.bench.correctness import check_backward
from fa2gen.bench.grid import Case, make_inputs
from fa2gen.bench.timing import kernel_ms, measure
from fa2gen.generator.spec import TuningParams
from fa2gen.runtime.device import cuda_device_info
from fa2gen.runtime.dispatch import select_params
from fa2gen.runtime.launch import forward
from fa2gen.runtime.problem import make_problem

CELLS = [(128, 1024), (128, 2048), (128, 4096), (128, 16384), (64, 4096)]
TILES = {"64x64": TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=2, loads="tma_host",
                               dq_mode="matmul", gluon=1),
         "64x32": TuningParams(block_m=64, block_n=32, num_warps=4, num_stages=3, loads="tma_host",
                               dq_mode="matmul", gluon=1)}
VARIANTS = [("64x64", 1), ("64x64", 8), ("64x64", 16), ("64x64", 32), ("64x32", 16)]
CHECKED = 4096


def cell(d: int, n: int, dtype: str) -> dict:
    case = Case(16384 // n, 2048 // d, n, d, True, dtype)
    q, k, v = make_inputs(case, torch.device("cuda"))
    problem = make_problem(q, k, v, causal=True)
    dev = cuda_device_info(torch.cuda.current_device())
    out, lse = forward(q, k, v, problem, select_params(problem, dev))
    dout = torch.randn_like(out)
    shipped = select_params(problem, dev, direction="bwd")
    row = {"cell": f"{dtype} D={d} N={n} causal", "shipped": shipped.label(), "ms": {}, "ok": {}, "split": {}}
    variants = [("shipped", shipped, 8)] + [(f"{t} bands {c}", TILES[t], c) for t, c in VARIANTS]
    for name, params, bands in variants:
        bwd.CAUSAL_BANDS, bwd.CAUSAL_BAND_ROWS = bands, 128
        kept = bwd.BackwardLaunch(problem, params)
        grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
        kept.run(q, k, v, out, lse, dout, dq=grads[0], dk=grads[1], dv=grads[2])
        if n <= CHECKED:
            b = min(case.batch, 2)
            verdict = check_backward(q[:b], k[:b], v[:b], make_problem(q[:b], k[:b], v[:b], causal=True),
                                     dout[:b], grads[0][:b], grads[1][:b], grads[2][:b])
            row["ok"][name] = verdict.ok
        else:
            row["ok"][name] = not any(torch.isnan(g).any().item() for g in grads)
        row["ms"][name] = measure(lambda: kept.run(q, k, v, out, lse, dout)).median_ms
        if name != "shipped":
            split = kernel_ms(lambda: kept.run(q, k, v, out, lse, dout), ("attn_bwd_delta", "attn_bwd_dkdv", "nvjet"))
            row["split"][name] = {
                "dkdv": split.pop("attn_bwd_dkdv", 0.0), "matmul": split.pop("nvjet", 0.0),
                "delta": split.pop("attn_bwd_delta", 0.0), "other": sum(split.values())}
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
        row["cudnn_ms"] = measure(lambda: torch.autograd.grad(o, (qg, kg, vg), dout, retain_graph=True)).median_ms
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="fp16")
    args = ap.parse_args()
    rows = []
    for d, n in CELLS:
        row = cell(d, n, args.dtype)
        rows.append(row)
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "dtype": args.dtype, "rows": rows}, f, indent=1)
        ratios = "  ".join(f"{k} {row['cudnn_ms'] / v:.3f}{'' if row['ok'][k] else ' FAIL'}" for k, v in row["ms"].items())
        print(f"{row['cell']:22s} x cuDNN: {ratios}", flush=True)
        for k, s in row["split"].items():
            print(f"    {k:16s} " + " ".join(f"{a} {b:.3f}" for a, b in s.items()), flush=True)


if __name__ == "__main__":
    main()
