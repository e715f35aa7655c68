"""Dropout (dropout_p): the kernels' mask, its statistics, its repeatability, and the forward and
backward against the reference that applies the same mask, dense and packed."""

import dataclasses
import math
import re

import pytest
import torch
from helpers import MASK_CASES, ODD_SHAPES, rand_qkv
from test_varlen import packed

import fa2gen
from fa2gen.bench.correctness import ATOL, check_backward, check_forward
from fa2gen.generator import rendering
from fa2gen.generator.spec import KernelSpec, SpecError, TuningParams, unsupported
from fa2gen.runtime.backward import backward
from fa2gen.runtime.dropout import check_dropout, draw_seed, keep_mask, problem_mask
from fa2gen.runtime.kvcache import serves_as_cache
from fa2gen.runtime.launch import forward
from fa2gen.runtime.problem import make_problem, make_varlen_problem
from fa2gen.runtime.varlen import varlen_reference


def dropped_problem(q, k, v, **options):
    return dataclasses.replace(make_problem(q, k, v, **options), dropout=True)


def run_with_mask(q, k, v, dout, p, seed, options):
    """attention() with dropout_p under torch seed ``seed``, forward and backward; returns the
    problem, (out, lse), the gradients and the mask the call drew."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    torch.manual_seed(seed)
    out, lse = fa2gen.attention(*leaves, dropout_p=p, return_lse=True, **options)
    out.backward(dout)
    problem = dropped_problem(q, k, v, **options)
    torch.manual_seed(seed)  # the seed the call drew, drawn again
    mask = problem_mask(draw_seed(q.device), p, problem)
    return problem, (out.detach(), lse), [t.grad for t in leaves], mask


def within_binomial(kept: int, n: int, p: float, sigmas: float = 5.0) -> bool:
    return abs(kept - n * (1 - p)) <= sigmas * math.sqrt(n * p * (1 - p))


@pytest.mark.interpreter
@pytest.mark.parametrize("options", MASK_CASES[:6], ids=str)
def test_dropout_matches_the_reference_with_the_mask_it_drew_forward_and_backward(options):
    shape = ODD_SHAPES[1]  # (2, 4, 2, 45, 77, 32): GQA, Nq != Nk
    q, k, v = rand_qkv(*shape, seed=7)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(8)).to(q.dtype)
    problem, (out, lse), grads, mask = run_with_mask(q, k, v, dout, 0.23, seed=11, options=options)
    verdict = check_forward(q, k, v, problem, out, lse, dropout=(mask, 0.23))
    assert verdict.ok, str(verdict)
    verdict = check_backward(q, k, v, problem, dout, *grads, dropout=(mask, 0.23))
    assert verdict.ok, str(verdict)
    # the mask matters: without it (or with another seed's) the output disagrees
    assert not check_forward(q, k, v, problem, out, lse).ok
    other = problem_mask(draw_seed(q.device), 0.23, problem)
    assert not check_forward(q, k, v, problem, out, lse, dropout=(other, 0.23)).ok


@pytest.mark.interpreter
@pytest.mark.parametrize("shape", [ODD_SHAPES[0], ODD_SHAPES[2], ODD_SHAPES[3]], ids=str)
@pytest.mark.parametrize(
    "fwd, bwd",
    [
        (TuningParams(32, 32, 4, 1, "pointer"), TuningParams(32, 16, 4, 1)),
        (TuningParams(32, 16, 4, 1, "tma_host"), TuningParams(16, 32, 4, 1, dq_mode="atomic")),
        (TuningParams(16, 32, 4, 1, "tma_device"), TuningParams(32, 16, 4, 1, "tma_host", dq_mode="tma_reduce")),
    ],
    ids=lambda p: p.label(),
)
def test_every_tiling_load_path_and_dq_form_draws_the_same_mask(shape, fwd, bwd):
    q, k, v = rand_qkv(*shape, dtype=torch.bfloat16, seed=sum(shape))
    problem = dropped_problem(q, k, v, causal=True)
    seed = draw_seed(q.device)
    mask = problem_mask(seed, 0.4, problem)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((shape[0], shape[1], shape[3]), float("nan"))
    forward(q, k, v, problem, fwd, out=out, lse=lse, dropout=(seed, 0.4))
    verdict = check_forward(q, k, v, problem, out, lse, dropout=(mask, 0.4))
    assert verdict.ok, str(verdict)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(2)).to(q.dtype)
    grads = backward(q, k, v, out, lse, dout, problem, bwd, dropout=(seed, 0.4))
    verdict = check_backward(q, k, v, problem, dout, *grads, dropout=(mask, 0.4))
    assert verdict.ok, str(verdict)


@pytest.mark.interpreter
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_the_keep_rate_is_one_minus_p_in_every_stream_and_masks_are_independent(p):
    streams, rows, cols = 6, 64, 96
    mask = keep_mask(draw_seed("cpu"), p, streams, rows, cols)
    n = rows * cols
    assert within_binomial(int(mask.sum()), streams * n, p)
    for s in range(streams):
        assert within_binomial(int(mask[s].sum()), n, p), f"stream {s}"
    # rows, columns and streams draw apart: two of them agree as often as independent draws do
    agree = p * p + (1 - p) * (1 - p)
    spread = 5 * math.sqrt(n * agree * (1 - agree))
    for a, b in ((mask[0], mask[1]), (mask[2, :32], mask[2, 32:]), (mask[3, :, :48], mask[3, :, 48:])):
        assert abs(int((a == b).sum()) - a.numel() * agree) <= spread * math.sqrt(a.numel() / n)
    other = keep_mask(draw_seed("cpu"), p, streams, rows, cols)  # another seed: another mask
    assert abs(int((other == mask).sum()) - mask.numel() * agree) <= spread * math.sqrt(streams)


@pytest.mark.interpreter
def test_the_same_seed_gives_the_same_result_and_gradients():
    q, k, v = rand_qkv(*ODD_SHAPES[2], seed=1)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(3)).to(q.dtype)
    _, (out1, _), grads1, mask1 = run_with_mask(q, k, v, dout, 0.3, seed=42, options={"causal": True})
    _, (out2, _), grads2, mask2 = run_with_mask(q, k, v, dout, 0.3, seed=42, options={"causal": True})
    assert torch.equal(mask1, mask2) and torch.equal(out1, out2)
    assert all(torch.equal(a, b) for a, b in zip(grads1, grads2))
    _, (out3, _), _, mask3 = run_with_mask(q, k, v, dout, 0.3, seed=43, options={"causal": True})
    assert not torch.equal(mask1, mask3) and not torch.equal(out1, out3)
    # consecutive calls without reseeding draw new masks
    torch.manual_seed(42)
    a, b = (fa2gen.attention(q, k, v, dropout_p=0.3) for _ in range(2))
    assert not torch.equal(a, b)


@pytest.mark.interpreter
def test_dropout_p_zero_is_the_plain_kernel():
    q, k, v = rand_qkv(*ODD_SHAPES[1], seed=4)
    assert torch.equal(fa2gen.attention(q, k, v, dropout_p=0.0), fa2gen.attention(q, k, v))


@pytest.mark.interpreter
@pytest.mark.parametrize("options", [{}, {"causal": True}, {"window_size": (9, 0)}], ids=str)
def test_a_packed_batch_with_dropout_matches_the_reference_with_its_mask(options):
    lq, lk = [5, 0, 1, 33, 17], [9, 4, 1, 33, 0]
    q, k, v, cq, ck = packed(lq, lk, Hq=4, Hkv=2, D=40, seed=6)
    problem = dataclasses.replace(make_varlen_problem(q, k, v, cq, ck, max(lq), max(lk), **options), dropout=True)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    torch.manual_seed(9)
    out = fa2gen.attention_varlen(*leaves, cq, ck, max(lq), max(lk), dropout_p=0.35, **options)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(4)).to(q.dtype)
    out.backward(dout)
    torch.manual_seed(9)
    drop = (problem_mask(draw_seed(q.device), 0.35, problem), 0.35)
    exact = [t.float().requires_grad_() for t in (q, k, v)]
    ref = varlen_reference(*exact, cq, ck, problem, dropout=drop)[0]
    ref.backward(dout.float())
    base = [t.clone().requires_grad_() for t in (q, k, v)]
    pytorch = varlen_reference(*base, cq, ck, problem, compute_dtype=q.dtype, dropout=drop)[0]
    pytorch.backward(dout)
    pairs = [("out", out, ref, pytorch)] + [
        (name, got.grad, r.grad, b.grad) for name, got, r, b in zip(("dq", "dk", "dv"), leaves, exact, base)
    ]
    for name, got, r, b in pairs:
        err = (got.float() - r).abs().max().item()
        allowed = 2 * (b.float() - r).abs().max().item() + ATOL
        assert err <= allowed, f"{name}: error {err:.2e} > {allowed:.2e}"


def test_dropout_p_is_checked_and_named():
    q, k, v = rand_qkv(1, 2, 2, 8, 8, 64)
    for bad, error in ((1.0, ValueError), (-0.1, ValueError), (float("nan"), ValueError), ("0.1", TypeError)):
        with pytest.raises(error, match="dropout_p"):
            fa2gen.attention(q, k, v, dropout_p=bad)
    with pytest.raises(TypeError, match="dropout_p"):
        check_dropout(True)
    q8, k8, v8 = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
    with pytest.raises(ValueError, match="dropout_p.*fp8"):
        fa2gen.attention(q8, k8, v8, dropout_p=0.1)


def test_dropout_has_its_own_kernels_and_no_decode_or_gluon_form():
    spec = KernelSpec(direction="fwd", dropout=True)
    assert "dropout" in KernelSpec(direction="bwd", dropout=True).to_dict()
    assert "dropout" not in KernelSpec(direction="bwd").to_dict()  # (plain specs render as before)
    for bad in ({"direction": "decode"}, {"dtype": "fp8e4m3"}):
        with pytest.raises(SpecError, match="dropout"):
            KernelSpec(dropout=True, **bad)
    assert "dropout" in unsupported(spec, TuningParams(128, 64, 4, 2, "tma_host", gluon=1))
    # the decode kernels have no dropout: short queries with dropout stay on the dense forward
    q, k, v = rand_qkv(1, 8, 2, 1, 8192, 64)
    assert serves_as_cache(make_problem(q, k, v))
    assert not serves_as_cache(dropped_problem(q, k, v))


def test_the_template_hash_covers_every_included_file():
    for direction in ("fwd", "bwd", "decode"):
        files = (rendering.TEMPLATES[direction],) + rendering.EXTRA_TEMPLATES[direction]
        included = {m for f in files for m in re.findall(r'{%-?\s*include\s+"([^"]+)"', rendering._file_source(f))}
        assert included == set(rendering.INCLUDED[direction]), direction


# -- GPU ------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(2, 8, 2, 1000, 1000, 128), (1, 6, 3, 777, 1535, 72), (2, 4, 4, 2048, 2048, 64)])
@pytest.mark.parametrize("options", [{}, {"causal": True}, {"window_size": (300, 0)}], ids=str)
def test_dropout_on_the_gpu_forward_and_backward_against_the_mask(dtype, shape, options):
    q, k, v = rand_qkv(*shape, dtype=dtype, device="cuda", seed=sum(shape))
    dout = torch.randn(q.shape, device="cuda", dtype=torch.float32).to(dtype)
    problem, (out, lse), grads, mask = run_with_mask(q, k, v, dout, 0.17, seed=5, options=options)
    verdict = check_forward(q, k, v, problem, out, lse, dropout=(mask, 0.17))
    assert verdict.ok, str(verdict)
    verdict = check_backward(q, k, v, problem, dout, *grads, dropout=(mask, 0.17))
    assert verdict.ok, str(verdict)


@pytest.mark.gpu
def test_the_keep_rate_on_the_gpu_over_millions_of_draws():
    for p in (0.1, 0.5):
        mask = keep_mask(draw_seed("cuda"), p, 32, 1024, 1024)
        assert within_binomial(int(mask.sum()), mask.numel(), p, sigmas=6.0)
        assert all(within_binomial(int(m.sum()), m.numel(), p, sigmas=6.0) for m in mask)


@pytest.mark.gpu
def test_dropout_repeats_bit_for_bit_on_the_gpu_and_in_a_packed_batch():
    q, k, v = rand_qkv(2, 8, 2, 1500, 1500, 128, dtype=torch.bfloat16, device="cuda", seed=3)
    dout = torch.randn(q.shape, device="cuda").to(q.dtype)
    _, (out1, _), grads1, _ = run_with_mask(q, k, v, dout, 0.1, seed=1, options={"causal": True})
    _, (out2, _), grads2, _ = run_with_mask(q, k, v, dout, 0.1, seed=1, options={"causal": True})
    assert torch.equal(out1, out2) and all(torch.equal(a, b) for a, b in zip(grads1, grads2))
    lq = lk = [0, 1, 4096, 777]
    q, k, v, cq, ck = packed(lq, lk, Hq=8, Hkv=2, D=128, dtype=torch.bfloat16, device="cuda", seed=2)
    problem = dataclasses.replace(make_varlen_problem(q, k, v, cq, ck, 4096, 4096, causal=True), dropout=True)
    torch.manual_seed(3)
    out = fa2gen.attention_varlen(q, k, v, cq, ck, 4096, 4096, causal=True, dropout_p=0.2)
    torch.manual_seed(3)
    drop = (problem_mask(draw_seed("cuda"), 0.2, problem), 0.2)
    ref = varlen_reference(q.float(), k.float(), v.float(), cq, ck, problem, dropout=drop)[0]
    base = varlen_reference(q, k, v, cq, ck, problem, compute_dtype=q.dtype, dropout=drop)[0]
    assert (out.float() - ref).abs().max() <= 2 * (base.float() - ref).abs().max() + ATOL
