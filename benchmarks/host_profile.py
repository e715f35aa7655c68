"""Host time of one fa2gen.attention() call, piece by piece, on the local GPU.

Times each step of a call in isolation (validation, dispatch, output allocation,
descriptor construction, Triton's launch) and profiles a run of whole calls with
cProfile, so that per-call host work can be cut where it is largest. Short causal cells
are host-bound when a call costs more host time than the kernel takes on the GPU. The
backward is timed the same way: a gradient through autograd, and the three kernels'
launches (delta, dK/dV, dQ) with the dispatched params and, on sm90, with the Gluon dK/dV
kernel.

The problem is tiny (B=1, H=2, N=512, D=128, causal: a few microseconds on the GPU) so
that the GPU never holds the host back: with a real cell, launches queue up behind the
kernels and the loop measures GPU time instead.

usage: python benchmarks/host_profile.py OUT.json
"""

from __future__ import annotations

import cProfile
import functools
import io
import json
import pstats
import re
import sys

import torch

import fa2gen
from fa2gen.bench.grid import Case, make_inputs
from fa2gen.runtime import direct
from fa2gen.runtime.device import cuda_device_info
from fa2gen.runtime.dispatch import clear_memo, select_params
from fa2gen.runtime.backward import BackwardLaunch, backward
from fa2gen.runtime.launch import Launch, effective_params, forward, host_descriptor
from fa2gen.runtime.problem import make_problem
from fa2gen.tuner.space import GLUON_BWD_CANDIDATES
from overhead import host_us  # the same loop as overhead.py (this folder is on sys.path when run)


def _relative_paths(text: str) -> str:
    """Source files named from their package, not from where this machine keeps them."""
    return re.sub(r"(?:/[^\s:(]+)?/(site-packages|fa2gen)/", r"\1/", text)


def _launcher_alone(kernel, grid, args, options):
    """The compiled kernel's launcher called directly with arguments bound once: what a
    launch costs without Triton's per-call binding, specialisation and cache lookup (which a
    launch kept per call shape could skip). Reaches into Triton 3.6's JITFunction.run, so an
    other Triton may not have these pieces: then this entry is left out (None)."""
    try:
        from triton.runtime.driver import driver

        compiled = kernel.warmup(*args, grid=grid, **options)
        device = driver.active.get_current_device()
        binder = kernel.device_caches[device][4]
        bound = tuple(binder(*args, **options)[0].values())
        grid3 = (tuple(grid) + (1, 1))[:3]
        run, function, meta = compiled.run, compiled.function, compiled.packed_metadata
    except Exception as e:  # noqa: BLE001 - an experiment, not a code path users run
        print(f"launcher alone: not measured ({type(e).__name__}: {e})")
        return None

    def call():
        stream = driver.active.get_current_stream(device)
        run(*grid3, stream, function, meta, None, None, None, *bound)
    return call


def main(out_path):
    direct.ENABLED = False  # first every launch through Triton; direct launches at the end
    case = Case(1, 2, 512, 128, True, "fp16")
    q, k, v = make_inputs(case, torch.device("cuda"))
    pr = make_problem(q, k, v, causal=True)
    dev = cuda_device_info(torch.cuda.current_device())
    params = select_params(pr, dev)
    spec = pr.kernel_spec()
    out = torch.empty_like(q)
    lse = torch.empty((1, 2, 512), device="cuda", dtype=torch.float32)
    dp = spec.head_dim_padded
    plan = Launch(pr, params)
    kernel, args, options = plan.prepared(q, k, v, out, lse)
    launch = lambda: kernel[plan.grid](*args, **options)
    pieces = {
        "attention()": lambda: fa2gen.attention(q, k, v, causal=True),
        "forward()": lambda: forward(q, k, v, pr, params),
        "make_problem": lambda: make_problem(q, k, v, causal=True),
        "select_params (incl. device info)": lambda: select_params(pr, cuda_device_info(torch.cuda.current_device())),
        "effective_params": lambda: effective_params(spec, params, q, k, v, out),
        "empty_like + lse empty": lambda: (torch.empty_like(q), torch.empty((1, 2, 512), device="cuda")),
        "4 TensorDescriptors": lambda: [host_descriptor(t, 64, dp) for t in (q, k, v, out)],
        "Triton launch, prebuilt descriptors": launch,
        "Triton's launcher alone, same arguments": _launcher_alone(kernel, plan.grid, args, options),
        "empty CUDA op (torch.zeros_like(1 elem))": lambda: torch.zeros(1, device="cuda"),
    }
    # The backward's host path: its gradients through autograd, and backward() alone
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    og, lse_g = fa2gen.attention(qg, kg, vg, causal=True, return_lse=True)
    dout = torch.randn_like(og)
    bwd_params = select_params(pr, dev, "bwd")
    pieces["gradients through autograd"] = lambda: torch.autograd.grad(og, (qg, kg, vg), dout, retain_graph=True)
    # backward() builds its launch per call; attention()'s autograd keeps one per call shape
    for p in [bwd_params] + ([GLUON_BWD_CANDIDATES[0]] if dev.capability[0] == 9 else []):
        kept = BackwardLaunch(pr, p)
        pieces[f"backward() {p.label()}"] = functools.partial(backward, q, k, v, og, lse_g, dout, pr, p)
        pieces[f"kept BackwardLaunch.run {p.label()}"] = functools.partial(kept.run, q, k, v, og, lse_g, dout)
    pieces["attention() again, last"] = pieces["attention()"]
    result = {"device": torch.cuda.get_device_name(), "cell": case.label(), "params": params.to_dict(),
              "per_call_us": {name: round(host_us(fn, n=2000), 2) for name, fn in pieces.items() if fn}}
    # The same calls with the kept launches' kernels launched directly (FA2GEN_DIRECT_LAUNCH)
    direct.ENABLED = True
    clear_memo()
    qd, kd, vd = (t.detach().requires_grad_() for t in (q, k, v))
    od = fa2gen.attention(qd, kd, vd, causal=True)
    for name, fn in {
        "attention(), direct launches": lambda: fa2gen.attention(q, k, v, causal=True),
        "gradients through autograd, direct launches":
            lambda: torch.autograd.grad(od, (qd, kd, vd), dout, retain_graph=True),
    }.items():
        result["per_call_us"][name] = round(host_us(fn, n=2000), 2)
    clear_memo()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(2000):
        fa2gen.attention(q, k, v, causal=True)
    prof.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
    result["profile_tottime"] = _relative_paths(s.getvalue())
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)
    for name, us in result["per_call_us"].items():
        print(f"{name:45s} {us:8.2f} us")
    print(result["profile_tottime"][:6000])


if __name__ == "__main__":
    main(sys.argv[1])
