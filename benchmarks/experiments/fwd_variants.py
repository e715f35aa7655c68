"""Experiment: Gluon forward variants beside the shipped config and SDPA cuDNN (in bf16 for
fp8 cells), on canonical-grid cells (B*N = 16k, H = 2048 / D). Each variant's output is poisoned
with NaN, checked by flash-attention's rule, then timed (do_bench median, L2 flushed). VARIANTS
holds what the current question needs: how many persistent programs an SM the 64 x 64
one-partition form runs at D=64 (perf-notes, "three programs an SM"). A variant may name its
programs per SM apart from its params' ``persistent``: the grid is sized through ``Launch``'s
SM count, which the template never reads (its tiles are walked by ``gl.num_programs``). It
may also name the launch's registers a thread (the module's ``LAUNCH["maxnreg"]``, set for
that variant's timing alone: Triton compiles a binary per value).
results/fwd-variants/ holds v54's run, of persistent programs on 128 x 128 tiles;
results/fwd-variants-128x64/ the probe after v55; results/fwd-variants-one-partition/ the
probe of one partition of eight compute warps.

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
from fa2gen.generator.cache import load_module
from fa2gen.generator.spec import TuningParams, unsupported
from fa2gen.runtime.device import cuda_device_info
from fa2gen.runtime.dispatch import select_params
from fa2gen.runtime.launch import Launch, forward
from fa2gen.runtime.problem import make_problem

def _gluon(block_m: int, block_n: int, stages: int, persistent: int, groups: int) -> TuningParams:
    return TuningParams(block_m=block_m, block_n=block_n, num_warps=block_m // 16, num_stages=stages,
                        loads="tma_host", gluon=groups, persistent=persistent)


# name: (params, programs per SM or None for the params' own ``persistent``,
#        launch registers a thread or None for the template's)
VARIANTS = {
    "64x64 s3 p2": (_gluon(64, 64, 3, 2, 1), None, None),
    "64x64 s3 p3 r80": (_gluon(64, 64, 3, 2, 1), 3, 80),
    "64x64 s2 p2": (_gluon(64, 64, 2, 2, 1), None, None),
    "64x64 s2 p3 r80": (_gluon(64, 64, 2, 2, 1), 3, 80),
}


def timed(case, q, k, v, problem, params, programs=None, maxnreg=None):
    """(TFLOP/s, None) of ``params`` on the cell, or (None, why) where it fails or is wrong.
    ``programs``: persistent programs an SM, where not the params' own; ``maxnreg``: the
    launch's registers a thread, where not the template's."""
    module = load_module(problem.kernel_spec(), params) if maxnreg else None
    saved = module.LAUNCH if module else None
    if module:
        module.LAUNCH = {**saved, "maxnreg": maxnreg}
    try:
        return _timed(case, q, k, v, problem, params, programs)
    finally:
        if module:
            module.LAUNCH = saved


def _timed(case, q, k, v, problem, params, programs):
    try:
        sm_count = None  # the device's: a grid of persistent x SMs
        if programs:  # a grid of programs x SMs, given as persistent x that many "SMs"
            sms = cuda_device_info(q.device.index or 0).sm_count
            if not params.persistent or sms * programs % params.persistent:
                raise ValueError(f"{programs} programs an SM from persistent={params.persistent} on {sms} SMs")
            sm_count = sms * programs // params.persistent
        launch = Launch(problem, params, sm_count)
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
                    for name, (params, programs, regs) in [("shipped", (shipped, None, None)), *VARIANTS.items()]:
                        why = unsupported(spec, params)
                        tf, why = (None, why) if why else timed(case, q, k, v, problem, params, programs, regs)
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
