"""fp8 (e4m3) forward under Triton's interpreter: every load path, mask kind, odd shapes,
GQA, per-tensor and per-head descaling, NaN-poisoned outputs, and argument checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import MASK_CASES, ODD_SHAPES
from helpers import rand_fp8 as quantized

import fa2gen
from fa2gen.bench.correctness import check_forward
from fa2gen.generator.arch import fits, smem_estimate
from fa2gen.generator.spec import KernelSpec, SpecError, TuningParams, unsupported
from fa2gen.runtime.fp8 import check_descales, dequantized
from fa2gen.runtime.launch import forward
from fa2gen.runtime.problem import make_problem
from fa2gen.store.buckets import Bucket

pytestmark = pytest.mark.interpreter
F8 = torch.float8_e4m3fn
POINTER = TuningParams(block_m=32, block_n=32, num_warps=4, num_stages=1)
TMA_HOST = TuningParams(block_m=32, block_n=32, num_warps=4, num_stages=1, loads="tma_host")
TMA_DEVICE = TuningParams(block_m=16, block_n=64, num_warps=4, num_stages=1, loads="tma_device")


def run_fp8(tensors, scales, params, **kw):
    q, k, v = tensors
    problem = make_problem(q, k, v, **kw)
    descales = check_descales(problem, q.device, *scales)
    out = torch.full(q.shape, float("nan"), dtype=torch.bfloat16)
    lse = torch.full((problem.batch, problem.heads_q, problem.seqlen_q), float("nan"))
    forward(q, k, v, problem, params, out=out, lse=lse, descales=descales)
    return check_forward(q, k, v, problem, out, lse, descales=descales), out, lse


def _id(kw):
    return "-".join(f"{k}{v}" for k, v in kw.items()) or "plain"


@pytest.mark.parametrize("shape", ODD_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kw", MASK_CASES, ids=_id)
def test_fp8_matches_reference(shape, kw):
    tensors, scales = quantized(*shape)
    verdict, out, _ = run_fp8(tensors, scales, POINTER, **kw)
    assert out.dtype == torch.bfloat16
    assert verdict.ok, verdict


@pytest.mark.parametrize(
    "params",
    [TMA_HOST, TMA_DEVICE, TMA_HOST.replace(persistent=2)],
    ids=["tma_host", "tma_device", "tma_host-persistent"],
)
@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"window_size": (9, 4)}, {"softcap": 7.5}], ids=_id)
def test_fp8_descriptor_paths(params, kw):
    # D=80 pads to 128: the transposed V's descriptor zero-fills the head rows past 80
    tensors, scales = quantized(1, 4, 2, 45, 77, 80)
    verdict, _, _ = run_fp8(tensors, scales, params, **kw)
    assert verdict.ok, verdict


@pytest.mark.parametrize("params", [POINTER, TMA_HOST], ids=["pointer", "tma_host"])
def test_fp8_strided_layout_and_per_tensor_factors(params):
    tensors, scales = quantized(2, 2, 1, 33, 50, 64, per_head=False, layout="bnhd")
    assert not tensors[0].is_contiguous()
    verdict, _, _ = run_fp8(tensors, scales, params, causal=True)
    assert verdict.ok, verdict


def test_fp8_descale_factors_are_applied():
    """The same fp8 values with every factor doubled: scores scale by 4, the output by 2.
    Judged against the reference of the doubled factors; and the output computed with the
    original factors fails that judgement (the checker can tell them apart)."""
    tensors, scales = quantized(1, 2, 2, 40, 40, 64)
    doubled = tuple(s * 2 for s in scales)
    verdict, out2, _ = run_fp8(tensors, doubled, POINTER)
    assert verdict.ok, verdict
    _, out1, lse1 = run_fp8(tensors, scales, POINTER)
    q, k, v = tensors
    problem = make_problem(q, k, v)
    wrong = check_forward(q, k, v, problem, out1, lse1, descales=check_descales(problem, q.device, *doubled))
    assert not wrong.ok


def test_fp8_query_factors_per_kv_head_as_flash_attention_3_takes_them():
    tensors, (dq, dk, dv) = quantized(2, 4, 2, 30, 40, 64)
    q, k, v = tensors
    shared = dq.view(2, 2, 2).mean(-1)  # one factor per k/v head, shared by its two query heads
    out = fa2gen.attention(q, k, v, descale_q=shared, descale_k=dk, descale_v=dv)
    expanded = fa2gen.attention(q, k, v, descale_q=shared.repeat_interleave(2, dim=1), descale_k=dk, descale_v=dv)
    assert torch.equal(out, expanded)


def test_fp8_attention_api_returns_bf16_and_lse():
    tensors, scales = quantized(1, 3, 1, 21, 34, 48)
    q, k, v = tensors
    out, lse = fa2gen.attention(
        q, k, v, causal=True, return_lse=True, descale_q=scales[0], descale_k=scales[1], descale_v=scales[2]
    )
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    problem = make_problem(q, k, v, causal=True)
    verdict = check_forward(q, k, v, problem, out, lse, descales=check_descales(problem, q.device, *scales))
    assert verdict.ok, verdict


def test_fp8_close_to_unquantized_attention():
    """What fp8 costs in accuracy against attention on the unquantized values: bounded
    (quantizing q, k, v and P), and the reason docs/fp8.md reports it."""
    g = torch.Generator().manual_seed(3)
    x = [torch.randn(1, 2, 64, 64, generator=g) for _ in range(3)]
    x8 = [t.to(F8) for t in x]
    out = fa2gen.attention(*x8)
    problem = make_problem(*x8)  # the same semantics; the reference runs on the fp32 values
    ref = fa2gen.runtime.reference.attention_reference(*x, problem)[0]
    err = (out.float() - ref).abs().max().item()
    assert err < 0.1, err


def test_interpreter_rounds_to_e4m3_as_the_gpu_does():
    """Values just below a power of two round up across it (127.2 -> 128), subnormals
    survive: the interpreter's own conversion got both wrong."""
    import triton
    import triton.language as tl

    from fa2gen.compat import patch_interpreter

    @triton.jit
    def convert(X, Y, N: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(Y + i, tl.load(X + i).to(tl.float8e4nv))

    @triton.jit
    def to_bf16(X, Y, N: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(Y + i, tl.load(X + i).to(tl.bfloat16))

    @triton.jit
    def to_bf16_rtz(X, Y, N: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(Y + i, tl.load(X + i).to(tl.bfloat16, fp_downcast_rounding="rtz"))

    patch_interpreter()
    x = torch.tensor([127.2, 126.6, 31.03, 0.004, -0.0123, 250.0, 1.0, 0.3], dtype=torch.float32)
    y = torch.empty(8, dtype=F8)
    convert[(1,)](x, y, N=8)
    assert np.array_equal(y.float().numpy(), x.to(F8).float().numpy())
    assert y[0].float().item() == 128.0
    # bf16 from fp32 and from fp16: nearest even, as the GPU; an explicit rtz (fp32 only) truncates
    g = torch.Generator().manual_seed(0)
    for src in (torch.randn(64, generator=g), torch.randn(64, generator=g).half()):
        near = torch.empty(64, dtype=torch.bfloat16)
        to_bf16[(1,)](src, near, N=64)
        assert torch.equal(near, src.to(torch.bfloat16))
    rtz = torch.empty(64, dtype=torch.bfloat16)
    to_bf16_rtz[(1,)](src.float(), rtz, N=64)
    assert torch.equal(rtz.float(), (src.float().view(torch.int32) & -65536).view(torch.float32))  # low bits dropped
    assert not torch.equal(rtz, src.to(torch.bfloat16))  # random values: some round up


# ---------------------------------------------------------------------------------------------
# Arguments


def test_descale_on_non_fp8_inputs_is_refused():
    q = torch.randn(1, 2, 8, 32, dtype=torch.float16)
    with pytest.raises(ValueError, match="descale_k"):
        fa2gen.attention(q, q, q, descale_k=torch.ones(()))


def test_descale_must_be_float32():
    (q, k, v), _ = quantized(1, 2, 2, 8, 8, 32)
    with pytest.raises(TypeError, match="descale_q"):
        fa2gen.attention(q, k, v, descale_q=torch.ones((), dtype=torch.float16))


def test_descale_shape_is_checked():
    (q, k, v), _ = quantized(2, 2, 2, 8, 8, 32)
    with pytest.raises(ValueError, match=r"descale_v.*\(2, 2\)"):
        fa2gen.attention(q, k, v, descale_v=torch.ones(2, 3))


def test_descale_must_be_a_tensor():
    (q, k, v), _ = quantized(1, 2, 2, 8, 8, 32)
    with pytest.raises(TypeError, match="descale_k"):
        fa2gen.attention(q, k, v, descale_k=0.5)


def test_fp8_mixed_with_bf16_is_refused():
    (q, k, v), _ = quantized(1, 2, 2, 8, 8, 32)
    with pytest.raises(TypeError, match="k has dtype"):
        fa2gen.attention(q, k.to(torch.bfloat16), v)


def test_fp8_is_forward_only():
    (q, k, v), _ = quantized(1, 2, 2, 8, 8, 32)
    q.requires_grad_()
    with pytest.raises(ValueError, match="forward only"):
        fa2gen.attention(q, k, v)
    with pytest.raises(SpecError, match="forward only"):
        KernelSpec(direction="bwd", dtype="fp8e4m3")


def test_fp8_head_dim_16_is_refused():
    (q, k, v), _ = quantized(1, 2, 2, 8, 8, 16)
    with pytest.raises(ValueError, match="head_dim 16"):
        fa2gen.attention(q, k, v)


# ---------------------------------------------------------------------------------------------
# Spec and arch facts


def test_fp8_spec_facts():
    spec = KernelSpec(dtype="fp8e4m3", head_dim=128)
    half = KernelSpec(dtype="bf16", head_dim=128)
    assert spec.out_dtype == "bf16" and half.out_dtype == "bf16" and KernelSpec().out_dtype == "fp16"
    p = TuningParams(block_m=128, block_n=64, num_warps=4, num_stages=2, loads="tma_host")
    assert smem_estimate(spec, p) * 2 == smem_estimate(half, p)  # one byte per element
    assert "block_n >= 32" in unsupported(spec, p.replace(block_n=16))
    assert "head_dim > 16" in unsupported(KernelSpec(dtype="fp8e4m3", head_dim=16), p)
    assert fits(spec, p, "sm90") is None
    assert "fp8 tensor cores" in fits(spec, p.replace(loads="pointer"), "sm80")
    assert fits(spec, p.replace(loads="pointer"), "sm89") is None


def test_fp8_bucket_round_trips():
    q = torch.empty(2, 4, 300, 64, dtype=F8, device="meta")
    bucket = Bucket.of(make_problem(q, q, q))
    assert bucket.dtype == "fp8e4m3"
    assert Bucket.parse(bucket.key) == bucket
    assert bucket.kernel_spec().fp8


def test_dequantized_per_head():
    (q, _, _), (dq, _, _) = quantized(2, 3, 3, 5, 5, 32)
    problem = make_problem(q, q, q)
    got = dequantized(q, check_descales(problem, q.device, dq, None, None)[0])
    assert torch.allclose(got, q.float() * dq[:, :, None, None])


@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_transposed_v_is_an_exact_transpose(layout):
    from fa2gen.runtime.fp8 import transposed_v

    (_, _, v), _ = quantized(2, 3, 3, 5, 37, 72, layout=layout)
    vt = transposed_v(v)
    assert vt.shape == (2, 3, 72, 37) and vt.stride(-2) % 16 == 0  # rows padded for descriptors
    assert torch.equal(vt.view(torch.uint8), v.transpose(-1, -2).view(torch.uint8))


@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_transposed_v_in_key_order_matches_the_gluon_forwards_p(layout):
    """key_order: key 8a + 2q + b of each 16-key group at column 4q + 2a + b, the order the
    Gluon forward's P takes for its matmul (the same reshape and permute of P's columns), and
    zeros past Nk, so that P @ V is unchanged."""
    from fa2gen.runtime.fp8 import transposed_v

    (_, _, v), _ = quantized(2, 3, 3, 5, 37, 72, layout=layout)
    vt = transposed_v(v, key_order=True)
    assert vt.shape == (2, 3, 72, 48) and vt.stride(-2) % 16 == 0
    plain = torch.zeros(2, 3, 72, 48, dtype=torch.uint8)
    plain[..., :37] = v.transpose(-1, -2).view(torch.uint8)
    # the kernel's permutation of P's columns, applied to V^T's: P2 @ V2 = P @ V
    order = torch.arange(48).reshape(3, 2, 4, 2).permute(0, 2, 1, 3).reshape(48)
    assert torch.equal(vt.view(torch.uint8), plain[..., order])
    assert order[:16].tolist() == [0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15]
    p = torch.randn(5, 48, dtype=torch.float64)
    p[:, 37:] = 0  # masked keys
    dense = v.transpose(-1, -2)[0, 0].to(torch.float64)  # (D, Nk)
    assert torch.allclose(p[:, order] @ vt[0, 0].to(torch.float64).T, p[:, :37] @ dense.T)


def test_a_gluon_fp8_call_that_falls_back_stages_v_once_in_plain_order(monkeypatch):
    """A Gluon fp8 launch that cannot run here (the interpreter) falls back to the Triton
    template, which reads V in plain key order: V is staged once, for that kernel, and the
    answer holds with Nk not a multiple of 16."""
    import fa2gen.runtime.launch as launch_mod

    calls = []
    real = launch_mod.transposed_v

    def spy(v, *, key_order=False, **kw):
        calls.append(key_order)
        return real(v, key_order=key_order, **kw)

    monkeypatch.setattr(launch_mod, "transposed_v", spy)
    params = TuningParams(block_m=128, block_n=128, num_warps=8, num_stages=2, loads="tma_host", gluon=2)
    verdict, _, _ = run_fp8(*quantized(1, 2, 2, 21, 37, 64), params)
    assert verdict.ok, str(verdict)
    assert calls == [False]


def test_fp8_reference_path_without_the_interpreter(monkeypatch):
    """CPU tensors without the interpreter: PyTorch attention over the dequantized values,
    returned in bf16 as the kernel returns it."""
    from fa2gen.runtime import api

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(api, "_warned_cpu", False)
    (q, k, v), scales = quantized(1, 4, 2, 13, 13, 32)
    with pytest.warns(RuntimeWarning, match="reference path"):
        out = fa2gen.attention(q, k, v, causal=True, descale_q=scales[0], descale_k=scales[1], descale_v=scales[2])
    # PyTorch's own attention over the values the fp8 tensors stand for, per (batch, head)
    real = [t.float() * s[:, :, None, None] for t, s in zip((q, k, v), scales)]
    ref = torch.nn.functional.scaled_dot_product_attention(*real, is_causal=True, enable_gqa=True)
    assert out.dtype == torch.bfloat16
    assert (out.float() - ref).abs().max() <= 2 * (ref.to(torch.bfloat16).float() - ref).abs().max() + 1e-4


def test_fp8_one_factor_expanded_to_every_head():
    """A single factor given as an expanded (B, H) view (strides 0) is a per-tensor factor:
    the same answer as the 0-d factor, on the kernel and in the rule's reference."""
    (q, k, v), _ = quantized(2, 4, 2, 21, 30, 32, per_head=False)
    one = torch.tensor(0.01)
    out0 = fa2gen.attention(q, k, v, descale_q=one, descale_k=one, descale_v=one)
    wide = [one.expand(2, 4), one.expand(2, 2), one.expand(2, 2)]
    out1, lse1 = fa2gen.attention(q, k, v, descale_q=wide[0], descale_k=wide[1], descale_v=wide[2], return_lse=True)
    assert torch.equal(out0, out1)
    problem = make_problem(q, k, v)
    verdict = check_forward(q, k, v, problem, out1, lse1, descales=check_descales(problem, q.device, *wide))
    assert verdict.ok, verdict
