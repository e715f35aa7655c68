"""Probe: where the short forward cells' time goes. For each canonical-grid cell of N <= 1k
(B*N = 16k, H = 2048 / D), fa2gen.attention() and SDPA cuDNN timed three ways in one process:
do_bench on the call (as the bench does), do_bench on a CUDA graph of the same call (no host
time), and the GPU's own kernel time per call from the profiler.

usage: python benchmarks/experiments/short_fwd.py [--dtypes fp16] [--out short-fwd.json]
"""

from __future__ import annotations

import argparse
import json

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import fa2gen
from fa2gen.bench.grid import Case, make_inputs
from fa2gen.bench.timing import graph_replay, kernel_ms, measure


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="fp16")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for dtype in args.dtypes.split(","):
        for d in (64, 128):
            for causal in (False, True):
                for n in (512, 1024):
                    case = Case(16384 // n, 2048 // d, n, d, causal, dtype)
                    q, k, v = make_inputs(case, torch.device("cuda"))

                    def ours():
                        return fa2gen.attention(q, k, v, causal=causal)

                    def cudnn():
                        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

                    row = {"case": case.label()}
                    for name, fn in (("fa2gen", ours), ("cudnn", cudnn)):
                        fn()
                        try:
                            graph_ms = measure(graph_replay(fn)).median_ms
                        except RuntimeError as e:  # a call that cannot be captured is a result here
                            print(f"{case.label()} {name}: no graph: {str(e)[:120]}", flush=True)
                            graph_ms = float("nan")
                        row[name] = {"call_ms": measure(fn).median_ms, "graph_ms": graph_ms,
                                     "kernels_ms": sum(kernel_ms(fn).values())}
                    rows.append(row)
                    if args.out:
                        with open(args.out, "w") as f:
                            json.dump(rows, f, indent=1)
                    a, c = row["fa2gen"], row["cudnn"]
                    print(f"{case.label():40s} " + "  ".join(
                        f"{w}: {a[w] * 1e3:6.1f} / {c[w] * 1e3:6.1f} us = {c[w] / a[w]:.3f}"
                        for w in ("call_ms", "graph_ms", "kernels_ms")), flush=True)


if __name__ == "__main__":
    main()
