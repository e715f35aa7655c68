"""Shared test utilities: random inputs and the poisoned-output forward check."""

from __future__ import annotations

import torch

from fa2gen.bench.correctness import check_forward
from fa2gen.runtime.launch import forward
from fa2gen.runtime.problem import make_problem

# (B, Hq, Hkv, Nq, Nk, D): odd lengths, Nq != Nk both ways, GQA/MQA, padded head dims
ODD_SHAPES = [
    (1, 2, 2, 37, 37, 64),
    (2, 4, 2, 45, 77, 32),
    (1, 3, 1, 70, 33, 80),
    (1, 2, 1, 1, 50, 128),
    (1, 2, 2, 19, 1, 64),
]
# attention() options covering every mask kind, softcap and a custom scale
MASK_CASES = [
    {},
    {"causal": True},
    {"window_size": (9, 4)},
    {"window_size": (6, -1), "causal": True},
    {"softcap": 7.5},
    {"causal": True, "softcap": 3.0, "sm_scale": 0.3},
    {"window_size": (7, -1)},
    {"window_size": (-1, 5)},
]


def rand_qkv(B, Hq, Hkv, Nq, Nk, D, dtype=torch.float16, device="cpu", seed=0, layout="bhnd"):
    """Fresh random normal inputs; layout "bnhd" gives (B, N, H, D) storage viewed as (B, H, N, D)."""
    g = torch.Generator(device=device).manual_seed(seed)

    def make(H, N):
        if layout == "bnhd":
            return torch.randn(B, N, H, D, generator=g, device=device, dtype=torch.float32).to(dtype).transpose(1, 2)
        return torch.randn(B, H, N, D, generator=g, device=device, dtype=torch.float32).to(dtype)

    return make(Hq, Nq), make(Hkv, Nk), make(Hkv, Nk)


def run_and_check(q, k, v, params, **kw):
    """Run one variant on NaN-poisoned outputs and judge it by flash-attention's rule."""
    problem = make_problem(q, k, v, **kw)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((problem.batch, problem.heads_q, problem.seqlen_q), float("nan"), device=q.device)
    forward(q, k, v, problem, params, out=out, lse=lse)
    verdict = check_forward(q, k, v, problem, out, lse)
    return verdict, out, lse


def rand_fp8(B, Hq, Hkv, Nq, Nk, D, *, per_head=True, seed=0, layout="bhnd", device="cpu"):
    """Random normal q, k, v scaled per (batch, head) or per tensor into e4m3's range, with
    their descaling factors (fp8 tensor = x / descale)."""
    g = torch.Generator().manual_seed(seed)

    def make(H, N, spread):  # drawn on the CPU (one stream on any device), then moved
        if layout == "bnhd":
            x = torch.randn(B, N, H, D, generator=g).transpose(1, 2)
        else:
            x = torch.randn(B, H, N, D, generator=g)
        x = x * spread  # heads of different magnitudes, so that a per-head factor matters
        amax = x.abs().amax(dim=(2, 3)) if per_head else x.abs().amax()
        scale = (amax / 448.0).float()
        x8 = (x / (scale[:, :, None, None] if per_head else scale)).to(torch.float8_e4m3fn)
        return x8.to(device), scale.to(device)

    spreads = [torch.linspace(0.5, 4.0, H)[None, :, None, None] for H in (Hq, Hkv, Hkv)]
    (q, dq), (k, dk), (v, dv) = (make(H, N, s) for H, N, s in zip((Hq, Hkv, Hkv), (Nq, Nk, Nk), spreads))
    return (q, k, v), (dq, dk, dv)


def hopper() -> bool:
    """A Hopper GPU (sm90), where the Gluon kernels run."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def gluon_cases(candidates, cases, what: str):
    """Decorator of a GPU test run for each Gluon candidate ``params``, fp16 and bf16
    ``dtype``, and each ((B, Hq, Hkv, Nq, Nk, D), causal, layout) case, on sm90 only."""
    import pytest

    marks = [
        pytest.mark.gpu,
        pytest.mark.skipif(not hopper(), reason=f"{what} runs on sm90"),
        pytest.mark.parametrize("params", candidates, ids=lambda p: p.label()),
        pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"]),
        pytest.mark.parametrize(
            "shape,causal,layout", cases, ids=[f"{s}-{'causal' if c else 'full'}-{lay}" for s, c, lay in cases]
        ),
    ]

    def wrap(fn):
        for mark in reversed(marks):
            fn = mark(fn)
        return fn

    return wrap


def compiled_child(code: str, *args: str):
    """Run ``code`` in a child process without TRITON_INTERPRET (Gluon kernels only compile
    there, for sm90, with no GPU) and return the JSON its last line prints."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])
