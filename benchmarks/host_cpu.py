"""fa2gen's own host time per call, on any machine: the Python a forward or backward call
runs before and between Triton's launches, with the launches stubbed out.

Short cells are bound by host time (perf-notes v26, v29). Triton's launcher needs a GPU
(benchmarks/host_profile.py times it there); what fa2gen adds around it does not, so it
can be measured and compared here, on CPU tensors, change by change.

Test seam: ``_StubModule`` stands in for a compiled kernel module; its kernels accept any
launch and do nothing. The Gluon device check is answered yes so that the Gluon path runs.
Everything else (validation, dispatch memo, allocations, descriptors) is the real code.

usage: python benchmarks/host_cpu.py [OUT.json]
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.pop("TRITON_INTERPRET", None)  # the compiled path's host code, not the interpreter's

import torch  # noqa: E402

import fa2gen.runtime.autograd as autograd  # noqa: E402
import fa2gen.runtime.backward as backward_mod  # noqa: E402
import fa2gen.runtime.launch as launch_mod  # noqa: E402
from fa2gen.generator.gluon import descriptor_layout  # noqa: E402
from fa2gen.generator.spec import TuningParams  # noqa: E402
from fa2gen.runtime.problem import make_problem  # noqa: E402

TRITON_BWD = TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=2, loads="tma_host")
GLUON_BWD = TRITON_BWD.replace(gluon=1)
TRITON_FWD = TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=3, loads="tma_host")


def _noop(*args, **kwargs):
    return None


class _StubKernel:
    def __getitem__(self, grid):
        return _noop


class _StubModule:
    """Test seam: a compiled module whose kernels launch nothing."""

    LAUNCH = {"num_warps": 4}
    attn_fwd = attn_bwd_delta = attn_bwd_dkdv = attn_bwd_dq = attn_bwd_dq_store = _StubKernel()


def per_call_us(fn, calls: int = 3000, rounds: int = 7) -> float:
    """Median over rounds of the mean time of ``calls`` calls, after a warm-up."""
    for _ in range(calls // 5):
        fn()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return sorted(times)[rounds // 2]


def main(out_path: str | None) -> None:
    backward_mod.load_module = launch_mod.load_module = lambda spec, params: _StubModule
    launch_mod.gluon_device_ready = lambda *a, **kw: True
    q, k, v, out, dout = (torch.randn(1, 2, 512, 128, dtype=torch.bfloat16) for _ in range(5))
    lse = torch.randn(1, 2, 512)
    problem = make_problem(q, k, v, causal=True)
    results = {}

    for label, params in (("Gluon dK/dV config", GLUON_BWD), ("Triton-only config", TRITON_BWD)):
        autograd.select_params = lambda *a, _p=params, **kw: _p
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        o, _ = autograd.AttentionFunction.apply(*leaves, problem, lambda: (out.clone(), lse.clone()), False, {})
        results[f"gradients through autograd, {label}"] = per_call_us(
            lambda: torch.autograd.grad(o, leaves, dout, retain_graph=True))
        kept = backward_mod.BackwardLaunch(problem, params)
        results[f"kept BackwardLaunch.run, {label}"] = per_call_us(lambda: kept.run(q, k, v, out, lse, dout))

    class _Floor(torch.autograd.Function):
        # autograd around a function with the same inputs and outputs that does nothing
        @staticmethod
        def forward(ctx, a, b, c):
            ctx.save_for_backward(a, b, c)
            return a.clone()

        @staticmethod
        def backward(ctx, g):
            a, b, c = ctx.saved_tensors
            return torch.empty_like(a), torch.empty_like(b), torch.empty_like(c)

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = _Floor.apply(*leaves)
    results["autograd floor (a no-op Function)"] = per_call_us(
        lambda: torch.autograd.grad(o, leaves, dout, retain_graph=True))

    fwd = launch_mod.Launch(problem, TRITON_FWD, 132)
    results["forward() with a kept Launch"] = per_call_us(
        lambda: launch_mod.forward(q, k, v, problem, TRITON_FWD, launch=fwd))

    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
    from triton.tools.tensor_descriptor import TensorDescriptor

    layout = descriptor_layout((1, 1, 64, 128), "bf16")
    results["host descriptor, Triton's constructor"] = per_call_us(
        lambda: TensorDescriptor(q, list(q.shape), list(q.stride()), [1, 1, 64, 128]), calls=20000)
    results["host descriptor, fa2gen"] = per_call_us(lambda: launch_mod.host_descriptor(q, 64, 128), calls=20000)
    results["Gluon descriptor, Triton's constructor"] = per_call_us(
        lambda: GluonDescriptor(q, list(q.shape), list(q.stride()), [1, 1, 64, 128], layout), calls=20000)
    results["Gluon descriptor, fa2gen"] = per_call_us(
        lambda: launch_mod.gluon_descriptor(q, [1, 1, 64, 128], layout), calls=20000)

    report = {"cell": "bf16 B=1 H=2 N=512 D=128 causal, launches stubbed", "torch": torch.__version__,
              "per_call_us": {name: round(us, 2) for name, us in results.items()}}
    if out_path:
        with open(out_path, "w") as f:
            json.dump(report, f, indent=1)
    for name, us in report["per_call_us"].items():
        print(f"{name:55s} {us:8.2f} us")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
