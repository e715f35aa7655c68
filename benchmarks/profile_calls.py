"""A few identical attention calls to run under a profiler (Nsight Compute), nothing else.

Warms up (compiles, tunes nothing), then makes --calls calls of the forward or the backward,
with the config attention() dispatches (or --dq-mode for the backward), or of SDPA's cuDNN
forward or backward (--provider sdpa-cudnn) or a Gluon forward variant of
benchmarks/experiments/gluon_fwd.py (--provider gluon --variant I) for a side-by-side profile. The calls after the warm-up run
inside the NVTX range "profile", so that ncu can skip everything else. Example:

  ncu --clock-control none --nvtx --nvtx-include "profile/" --kernel-name regex:attn_bwd --launch-count 3 \
      --section SpeedOfLight --section WarpStateStats --section Occupancy \
      python benchmarks/profile_calls.py --direction bwd --shape 2,16,8192,128 --causal

usage: python benchmarks/profile_calls.py [--direction fwd|bwd] [--provider fa2gen|sdpa-cudnn|gluon] [--variant I]
       [--shape B,H,N,D] [--dtype fp16|bf16|fp8e4m3] [--causal] [--calls N] [--dq-mode separate|atomic]

fp8e4m3 profiles fa2gen's forward only (each call also launches V's staged copy, whose kernel
is named "transpose": a --kernel-name regex:attn_fwd skips it).
"""

from __future__ import annotations

import argparse

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention

from fa2gen.bench.grid import Case, make_inputs
from fa2gen.runtime.backward import backward
from fa2gen.runtime.device import cuda_device_info
from fa2gen.runtime.dispatch import select_params
from fa2gen.runtime.launch import forward
from fa2gen.runtime.problem import make_problem


def _gluon_experiment():
    """benchmarks/experiments/gluon_fwd.py as a module (the experiments folder is not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parent / "experiments" / "gluon_fwd.py"
    spec = importlib.util.spec_from_file_location("gluon_fwd", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--direction", choices=("fwd", "bwd"), default="bwd")
    ap.add_argument("--provider", choices=("fa2gen", "sdpa-cudnn", "gluon"), default="fa2gen")
    ap.add_argument("--variant", type=int, default=0, help="with --provider gluon: index into gluon_fwd.VARIANTS")
    ap.add_argument("--shape", default="2,16,8192,128", help="B,H,N,D")
    ap.add_argument("--dtype", choices=("fp16", "bf16", "fp8e4m3"), default="bf16")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--dq-mode", choices=("separate", "atomic"))
    args = ap.parse_args()
    if args.provider == "gluon" and args.direction != "fwd":
        ap.error("--provider gluon profiles the forward only (add --direction fwd)")
    if args.dtype == "fp8e4m3" and (args.direction != "fwd" or args.provider != "fa2gen"):
        ap.error("--dtype fp8e4m3 profiles fa2gen's forward only (add --direction fwd)")
    b, h, n, d = (int(x) for x in args.shape.split(","))
    q, k, v = make_inputs(Case(b, h, n, d, args.causal, args.dtype), torch.device("cuda"))
    problem = make_problem(q, k, v, causal=args.causal)
    info = cuda_device_info(torch.cuda.current_device())
    out, lse = forward(q, k, v, problem, select_params(problem, info))
    params = select_params(problem, info, args.direction)
    if args.direction == "bwd" and args.dq_mode:
        params = params.replace(dq_mode=args.dq_mode)
    dout = torch.randn_like(out)
    if args.provider == "gluon":
        gluon_fwd = _gluon_experiment()
        variant = gluon_fwd.VARIANTS[args.variant]
        gluon_launch = gluon_fwd.launcher(q, k, v, *variant, args.causal)[0]

    if args.provider == "sdpa-cudnn" and args.direction == "bwd":
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out_g = scaled_dot_product_attention(qg, kg, vg, is_causal=args.causal)

    def call():
        if args.provider == "gluon":
            gluon_launch()
        elif args.provider == "sdpa-cudnn" and args.direction == "bwd":  # its backward kernels only
            torch.autograd.grad(out_g, (qg, kg, vg), dout, retain_graph=True)
        elif args.provider == "sdpa-cudnn":
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                scaled_dot_product_attention(q, k, v, is_causal=args.causal)
        elif args.direction == "fwd":
            forward(q, k, v, problem, params)
        else:
            backward(q, k, v, out, lse, dout, problem, params)

    for _ in range(2):  # warm-up calls compile and settle, outside the profiled range
        call()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("profile")
    for _ in range(args.calls):
        call()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    what = {"sdpa-cudnn": "SDPA cuDNN", "fa2gen": params.label()}.get(args.provider)
    what = what or f"Gluon {gluon_fwd.label(variant)}"
    print(f"{args.direction} {args.shape} {args.dtype} causal={args.causal}: {what}")


if __name__ == "__main__":
    main()
