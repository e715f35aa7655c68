"""Experiment: Gluon forward variants beside the shipped config and SDPA cuDNN (in bf16 for
fp8 cells), on canonical-grid cells (B*N = 16k, H = 2048 / D). Each variant's output is poisoned
with NaN, checked by flash-attention's rule, then timed (do_bench median, L2 flushed). VARIANTS
holds what the current question needs: under the causal mask at N <= 1k, the 128-row tiles
with all eight compute warps in one partition (one copy of the key loops in the kernel, where
two partitions have one each) beside the two-partition and 64-row forms the tuner searches
(perf-notes, "Profile (after v70)"). results/fwd-variants/ holds v54's run, of persistent
programs on 128 x 128 tiles; results/fwd-variants-128x64/ the probe after v55.

usage: python benchmarks/experiments/fwd_variants.py [--dtypes fp16,bf16] [--head-dims 64,128]
                                                     [--seqlens 512,...] [--masks none,causal]
                                                     [--out fwd-variants.json]
"""

from __future__ import annotations

import argparse
import json

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from fa2gen.bench.correctness import check_forward
from fa2gen.bench.grid import Case, make_inputs
from fa2gen.bench.timing import measure
from fa2gen.generator.spec import TuningParams, unsupported
from fa2gen.runtime.device import cuda_device_info
from fa2gen.runtime.dispatch import select_params
from fa2gen.runtime.launch import Launch, forward
from fa2gen.runtime.problem import make_problem

def _gluon(block_m: int, block_n: int, stages: int, persistent: int, groups: int) -> TuningParams:
    return TuningParams(block_m=block_m, block_n=block_n, num_warps=block_m // 16, num_stages=stages,
                        loads="tma_host", gluon=groups, persistent=persistent)


VARIANTS = {
    "128x64 s3 p1 one": _gluon(128, 64, 3, 1, 1),
    "128x64 s3 p2 one": _gluon(128, 64, 3, 2, 1),
    "128x128 s2 p1 one": _gluon(128, 128, 2, 1, 1),
    "128x64 s4 p1 two": _gluon(128, 64, 4, 1, 2),
    "128x64 s3 p2 two": _gluon(128, 64, 3, 2, 2),
    "128x128 s2 p1 two": _gluon(128, 128, 2, 1, 2),
    "128x128 s3 p1 two": _gluon(128, 128, 3, 1, 2),
    "64x64 s4 p2 one": _gluon(64, 64, 4, 2, 1),
}


def timed(case, q, k, v, problem, params):
    """(TFLOP/s, None) of ``params`` on the cell, or (None, why) where it fails or is wrong."""
    try:
        launch = Launch(problem, params)
        fp8 = problem.kernel_spec().fp8
        out = torch.full(q.shape, float("nan"), device=q.device, dtype=torch.bfloat16 if fp8 else q.dtype)
        out, lse = forward(q, k, v, problem, params, out=out, launch=launch)
        verdict = check_forward(q, k, v, problem, out, lse)
    except Exception as e:  # a variant that fails to compile or launch is a result here
        return None, f"failed: {type(e).__name__}: {str(e)[:160]}"
    if not verdict.ok:
        return None, f"WRONG {verdict}"
    return case.flops() / measure(lambda: forward(q, k, v, problem, params, launch=launch)).median_ms / 1e9, None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="fp16")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--seqlens", default="512,1024,2048")
    ap.add_argument("--masks", default="none,causal")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    masks = args.masks.split(",")
    if not set(masks) <= {"none", "causal"}:
        ap.error(f"--masks: none and/or causal, not {args.masks!r}")
    rows = []
    for dtype in args.dtypes.split(","):
        for d in map(int, args.head_dims.split(",")):
            for causal in (m == "causal" for m in masks):
                for n in map(int, args.seqlens.split(",")):
                    case = Case(max(1, 16384 // n), 2048 // d, n, d, causal, dtype)
                    q, k, v = make_inputs(case, torch.device("cuda"))
                    problem = make_problem(q, k, v, causal=causal)
                    shipped = select_params(problem, cuda_device_info(0))
                    row = {"case": case.label(), "shipped": shipped.label(), "tflops": {}, "notes": {}}
                    spec = problem.kernel_spec()
                    for name, params in [("shipped", shipped), *VARIANTS.items()]:
                        why = unsupported(spec, params)
                        tf, why = (None, why) if why else timed(case, q, k, v, problem, params)
                        row["tflops"][name] = tf
                        if why:
                            row["notes"][name] = why
                            print(f"{case.label()} {name}: {why}", flush=True)
                    # (fp8: cuDNN in bf16 on the same values)
                    qc, kc, vc = (t.to(torch.bfloat16) if spec.fp8 else t for t in (q, k, v))
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        ms = measure(lambda: torch.nn.functional.scaled_dot_product_attention(
                            qc, kc, vc, is_causal=causal)).median_ms
                    row["tflops"]["cudnn"] = case.flops() / ms / 1e9
                    rows.append(row)
                    if args.out:  # after each cell, so that a run cut short keeps what it measured
                        with open(args.out, "w") as f:
                            json.dump(rows, f, indent=1)
                    t = row["tflops"]
                    print(f"{case.label():40s} {row['shipped']:38s} cuDNN {t['cudnn']:5.0f} "
                          + " ".join(f"{k} {v / t['cudnn']:.3f}" if v else f"{k} -" for k, v in t.items()
                                     if k != "cudnn"), flush=True)


if __name__ == "__main__":
    main()
