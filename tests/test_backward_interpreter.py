"""The generated backward kernels under Triton's interpreter, judged by flash-attention's
rule applied to each gradient (against autograd through the fp32 reference)."""

import zlib

import pytest
import torch
from helpers import MASK_CASES, ODD_SHAPES, rand_qkv

import fa2gen
from fa2gen.bench.correctness import check_backward
from fa2gen.generator.spec import TuningParams
from fa2gen.runtime.backward import backward
from fa2gen.runtime.launch import forward
from fa2gen.runtime.problem import make_problem

pytestmark = pytest.mark.interpreter

FWD = TuningParams(block_m=32, block_n=32, num_warps=4, num_stages=1)
BWD_POINTS = [
    TuningParams(block_m=32, block_n=16, num_warps=4, num_stages=1),
    TuningParams(block_m=16, block_n=32, num_warps=4, num_stages=2),
    TuningParams(block_m=32, block_n=16, num_warps=4, num_stages=1, loads="tma_host"),
    # dQ added from the dK/dV kernel with atomics, on both load paths
    TuningParams(block_m=32, block_n=16, num_warps=4, num_stages=1, dq_mode="atomic"),
    TuningParams(block_m=16, block_n=32, num_warps=4, num_stages=2, loads="tma_host", dq_mode="atomic"),
    # ... or by one bulk reduction per tile through a host descriptor
    TuningParams(block_m=32, block_n=16, num_warps=4, num_stages=1, loads="tma_host", dq_mode="tma_reduce"),
]
SHAPES = ODD_SHAPES[:4]  # the one-key case adds nothing the decode shape does not
MASKS = MASK_CASES[:4] + [{"causal": True, "softcap": 3.0, "sm_scale": 0.3}]


def _id(x):
    return "-".join(f"{k}={v}" for k, v in x.items()) or "full"


def _grads(q, k, v, problem, params, dout):
    out, lse = forward(q, k, v, problem, FWD)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))  # every element must be written
    return backward(q, k, v, out, lse, dout, problem, params, dq=dq, dk=dk, dv=dv)


@pytest.mark.parametrize("params", BWD_POINTS, ids=lambda p: p.label().replace(" ", "-"))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kw", MASKS, ids=_id)
def test_backward_matches_reference(params, shape, kw):
    seed = zlib.crc32(repr((shape, _id(kw))).encode()) % 1000
    q, k, v = rand_qkv(*shape, seed=seed)
    problem = make_problem(q, k, v, **kw)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 1)).to(q.dtype)
    dq, dk, dv = _grads(q, k, v, problem, params, dout)
    verdict = check_backward(q, k, v, problem, dout, dq, dk, dv)
    assert verdict.ok, str(verdict)


def test_backward_bf16():
    q, k, v = rand_qkv(1, 4, 2, 41, 59, 64, dtype=torch.bfloat16, seed=5)
    problem = make_problem(q, k, v, causal=True)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(6)).to(q.dtype)
    verdict = check_backward(q, k, v, problem, dout, *_grads(q, k, v, problem, BWD_POINTS[0], dout))
    assert verdict.ok, str(verdict)


def test_autograd_through_attention_with_strided_grad_output():
    """attention() is differentiable; (B, N, H, D) inputs and a grad_output whose last dim
    is not contiguous both work; the lse output carries no gradient."""
    q, k, v = rand_qkv(2, 4, 2, 33, 50, 32, layout="bnhd", seed=7)
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out, lse = fa2gen.attention(q, k, v, causal=True, return_lse=True)
    assert out.requires_grad and not lse.requires_grad
    dout = torch.randn(2, 4, 32, 33).to(torch.float16).transpose(-1, -2)  # stride(-1) != 1
    assert dout.stride(-1) != 1
    out.backward(dout)
    problem = make_problem(q, k, v, causal=True)
    verdict = check_backward(q.detach(), k.detach(), v.detach(), problem, dout, q.grad, k.grad, v.grad)
    assert verdict.ok, str(verdict)
    assert q.grad.shape == q.shape and k.grad.shape == k.shape


def test_gradients_are_bit_identical_across_runs():
    q, k, v = rand_qkv(1, 4, 1, 45, 45, 32, seed=8)  # MQA: dk, dv sum over four heads
    problem = make_problem(q, k, v, window_size=(12, 0))
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(9)).to(q.dtype)
    first = _grads(q, k, v, problem, BWD_POINTS[0], dout)
    second = _grads(q, k, v, problem, BWD_POINTS[0], dout)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_rows_without_keys_get_zero_gradient():
    # Nq > Nk under a causal mask: the first Nq - Nk query rows see no key.
    q, k, v = rand_qkv(1, 2, 2, 40, 17, 32, seed=10)
    problem = make_problem(q, k, v, causal=True)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(11)).to(q.dtype)
    dq, dk, dv = _grads(q, k, v, problem, BWD_POINTS[0], dout)
    assert torch.isfinite(dq).all() and torch.isfinite(dk).all() and torch.isfinite(dv).all()
    assert dq[:, :, : 40 - 17].abs().max() == 0
    assert check_backward(q, k, v, problem, dout, dq, dk, dv).ok


def test_deterministic_flag_is_checked():
    q, k, v = rand_qkv(1, 2, 2, 8, 8, 32)
    with pytest.raises(TypeError, match="deterministic"):
        fa2gen.attention(q, k, v, deterministic=1)


def _atomic_dispatch_spied(monkeypatch, atomic=None, record=lambda params: params.dq_mode) -> list:
    """Dispatch a backward config that adds dQ with atomics; returns the list where
    ``record`` of each backward launch's params autograd builds is kept (its dq_mode)."""
    import fa2gen.runtime.autograd as autograd

    atomic = atomic or TuningParams(block_m=32, block_n=16, num_warps=4, num_stages=1, dq_mode="atomic")
    monkeypatch.setattr(autograd, "select_params", lambda problem, dev, direction: atomic)
    built = []
    real = autograd.BackwardLaunch

    def spy(problem, params):
        built.append(record(params))
        return real(problem, params)

    monkeypatch.setattr(autograd, "BackwardLaunch", spy)
    return built


def test_a_deterministic_backward_runs_the_default_where_the_one_pass_is_tuned(monkeypatch):
    """The one pass (dq_mode atomic on the Gluon kernel's 128 x 64 tiles) has no dQ kernel of
    its own on those tiles: a deterministic backward runs the default backward instead."""
    from fa2gen.runtime.defaults import default_params

    one_pass = TuningParams(
        block_m=128, block_n=64, num_warps=8, num_stages=2, loads="tma_host", dq_mode="atomic", gluon=1
    )
    seen = _atomic_dispatch_spied(monkeypatch, one_pass, record=lambda params: params)
    q, k, v = (t.requires_grad_() for t in rand_qkv(1, 2, 1, 21, 30, 64, seed=16))
    out = fa2gen.attention(q, k, v, deterministic=True)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(17)).to(out.dtype)
    out.backward(dout)
    problem = make_problem(q, k, v)
    assert seen == [default_params(problem.kernel_spec("bwd"), "cpu", 21).replace(dq_mode="separate")]
    assert check_backward(q.detach(), k.detach(), v.detach(), problem, dout, q.grad, k.grad, v.grad).ok


@pytest.mark.parametrize("how", ["flag", "torch", "neither"])
def test_deterministic_mode_never_runs_atomic_dq(monkeypatch, how):
    """A tuned config may add dQ with atomics; deterministic=True, or torch's global
    deterministic switch, runs dQ in its own kernel instead."""
    seen = _atomic_dispatch_spied(monkeypatch)
    q, k, v = (t.requires_grad_() for t in rand_qkv(1, 2, 1, 21, 30, 32, seed=14))
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: how == "torch")
    out = fa2gen.attention(q, k, v, causal=True, deterministic=how == "flag")
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(15)).to(out.dtype)
    out.backward(dout)
    assert seen == ["atomic" if how == "neither" else "separate"]
    problem = make_problem(q, k, v, causal=True)
    assert check_backward(q.detach(), k.detach(), v.detach(), problem, dout, q.grad, k.grad, v.grad).ok


def test_backward_against_fp64_reference():
    """Gradcheck-style: each gradient against autograd through the reference in float64,
    within twice the error PyTorch makes in fp16 (plus atol)."""
    from fa2gen.runtime.reference import attention_reference

    q, k, v = rand_qkv(1, 4, 2, 29, 41, 32, seed=12)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = fa2gen.attention(*leaves, window_size=(10, 2))
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(13)).to(out.dtype)
    out.backward(dout)
    problem = make_problem(q, k, v, window_size=(10, 2))

    def grads(dtype):
        xs = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        o, _ = attention_reference(*xs, problem, compute_dtype=dtype)
        o.backward(dout.to(o.dtype))
        return [x.grad.double() for x in xs]

    exact, fp16 = grads(torch.float64), grads(torch.float16)
    for mine, ref, base in zip((t.grad for t in leaves), exact, fp16):
        err = (mine.double() - ref).abs().max().item()
        assert err <= 2 * (base - ref).abs().max().item() + 1e-4, err


def test_training_script_smoke(tmp_path):
    """benchmarks/train_gpt.py end to end on CPU: a tiny model, three steps, both runs."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "train.json"
    script = Path(__file__).parent.parent / "benchmarks" / "train_gpt.py"
    r = subprocess.run(
        [sys.executable, str(script), "--tiny", "--steps", "3", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(out.read_text())
    assert [run["name"] for run in data["runs"]] == ["fa2gen", "sdpa"]
    assert data["max_abs_loss_gap"] < 1e-2  # same seed, same batches: the curves agree


def test_double_backward_raises_instead_of_returning_wrong_values():
    q, k, v = (t.detach().requires_grad_() for t in rand_qkv(1, 2, 2, 20, 20, 32, seed=14))
    out = fa2gen.attention(q, k, v)
    (gq,) = torch.autograd.grad(out.float().pow(2).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError):
        gq.sum().backward()


def test_a_kept_backward_launch_serves_later_calls_and_the_deterministic_switch(monkeypatch):
    """attention() hands autograd the dict where a call shape's backward launches live: the
    second backward of that shape reuses the first one's, and a deterministic backward gets
    its own (dQ in its own kernel), both with the right gradients."""
    from fa2gen.runtime.autograd import differentiable

    built = _atomic_dispatch_spied(monkeypatch)
    launches = {}
    base = rand_qkv(1, 2, 1, 19, 27, 32, seed=16)
    for deterministic in (False, False, True, True):
        q, k, v = (t.detach().requires_grad_() for t in base)
        problem = make_problem(q, k, v, causal=True)
        out, _ = differentiable(
            q, k, v, problem, lambda: forward(q, k, v, problem, FWD), deterministic=deterministic, launches=launches
        )
        dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(17)).to(out.dtype)
        out.backward(dout)
        verdict = check_backward(q.detach(), k.detach(), v.detach(), problem, dout, q.grad, k.grad, v.grad)
        assert verdict.ok, str(verdict)
    assert built == ["atomic", "separate"]
    assert sorted(launches) == [False, True] and launches[True].params.dq_mode == "separate"


def test_the_bench_default_provider_runs_the_default_backward(monkeypatch):
    """`fa2gen bench`'s "default" column is fa2gen without tuned lookups in both directions:
    its backward runs the heuristic default backward config, whatever the tuned lookup says."""
    from fa2gen.bench.grid import Case
    from fa2gen.bench.providers import PROVIDERS
    from fa2gen.generator.spec import TuningParams as P
    from fa2gen.runtime import autograd
    from fa2gen.runtime.backward import BackwardLaunch
    from fa2gen.runtime.defaults import bucket_default
    from fa2gen.store.buckets import Bucket

    # A tuned lookup that answers something else, which the default provider must not take.
    monkeypatch.setattr(autograd, "select_params", lambda *a: P(block_m=16, block_n=16, num_warps=4, num_stages=1))
    ran = []
    real = BackwardLaunch.run
    monkeypatch.setattr(BackwardLaunch, "run", lambda self, *a, **kw: ran.append(self.params) or real(self, *a, **kw))
    case = Case(1, 2, 37, 32, True, "fp16")
    q, k, v = (t.detach().requires_grad_() for t in rand_qkv(1, 2, 2, 37, 37, 32, seed=23))
    run = PROVIDERS["fa2gen-default"].build(case, q, k, v)
    out = run()
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(24)).to(out.dtype)
    out.backward(dout)
    problem = make_problem(q, k, v, causal=True)
    assert ran == [bucket_default(Bucket.of(problem, "bwd"), "cpu")]
    verdict = check_backward(q.detach(), k.detach(), v.detach(), problem, dout, q.grad, k.grad, v.grad)
    assert verdict.ok, str(verdict)
