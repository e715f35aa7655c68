"""Tensors past 2**31 elements on the GPU: element offsets that 32-bit arithmetic would wrap.

Each case is built so that parts of it are exact problems of their own, which the reference
judges by flash-attention's rule at their own size: a sliding window makes the last rows of a
16M-token sequence depend on its last keys only, and heads of a wide batch are independent.
About 40 GB of GPU memory at the peak (q, k, v, the output and four gradients of 4.3 GB each).
"""

import gc

import pytest
import torch

import fa2gen
from fa2gen.bench.correctness import ATOL, check_backward, check_forward
from fa2gen.runtime.problem import make_problem
from fa2gen.runtime.reference import attention_reference

pytestmark = pytest.mark.gpu
LIMIT = 2**31


def _free_gb() -> float:
    free, _ = torch.cuda.mem_get_info()
    return free / 2**30


def _normal(*shape, seed):
    # drawn in slices (a 2**31-element randn needs as much again in fp32)
    g = torch.Generator(device="cuda").manual_seed(seed)
    t = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
    flat = t.view(-1, shape[-1])
    for i in range(0, flat.shape[0], 1 << 22):
        flat[i : i + (1 << 22)] = torch.randn(flat[i : i + (1 << 22)].shape, device="cuda", generator=g)
    return t


@pytest.fixture(autouse=True)
def _release():
    yield
    gc.collect()
    torch.cuda.empty_cache()


def _judge(name, got, exact, same_dtype):
    err = (got.float() - exact).abs().max().item()
    allowed = 2 * (same_dtype.float() - exact).abs().max().item() + ATOL
    assert err <= allowed, f"{name}: error {err:.3e} > allowed {allowed:.3e}"


def test_a_16m_token_sequence_with_a_window_past_2_31_elements_in_q_k_and_out():
    if _free_gb() < 45:
        pytest.skip(f"needs about 45 GiB of free GPU memory, {_free_gb():.0f} free")
    n, d, left = 2**24 + 999, 128, 127  # q, k, v and out: 2**31 + 127872 elements each
    q, k, v = (_normal(1, 1, n, d, seed=s) for s in range(3))
    assert q.numel() > LIMIT
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    out = fa2gen.attention(q, k, v, window_size=(left, 0))
    assert out.numel() > LIMIT
    dout = _normal(1, 1, n, d, seed=3)
    out.backward(dout)
    torch.cuda.synchronize()
    for a in (0, n - 300):  # the first rows and the last, whose offsets pass 2**31
        rows = slice(a, min(n, a + 300))
        keys = slice(max(0, a - left), rows.stop)
        sub = [t.detach()[:, :, s] for t, s in ((q, rows), (k, keys), (v, keys))]
        problem = make_problem(*sub, window_size=(left, 0))
        exact, _ = attention_reference(*(t.float() for t in sub), problem)
        same, _ = attention_reference(*sub, problem, compute_dtype=torch.bfloat16)
        _judge(f"out rows {a}+", out.detach()[:, :, rows], exact, same)
        # the sub-problem's gradients: dq of its rows, dk and dv of the keys whose every
        # viewer is one of its rows (those from its first row on)
        grads = {}
        for dtype in (torch.float32, torch.bfloat16):
            leaves = [t.to(dtype).requires_grad_() for t in sub]
            attention_reference(*leaves, problem, compute_dtype=dtype)[0].backward(dout[:, :, rows].to(dtype))
            grads[dtype] = [t.grad for t in leaves]
        # key j is seen by rows j to j + left
        last = rows.stop if rows.stop == n else rows.stop - left
        own = slice(rows.start - keys.start, last - keys.start)
        _judge(f"dq rows {a}+", q.grad[:, :, rows], grads[torch.float32][0], grads[torch.bfloat16][0])
        for name, got, i in (("dk", k.grad, 1), ("dv", v.grad, 2)):
            got = got[:, :, keys][:, :, own]
            _judge(f"{name} rows {a}+", got, grads[torch.float32][i][:, :, own], grads[torch.bfloat16][i][:, :, own])


def test_a_wide_batch_past_2_31_elements_forward_and_backward():
    if _free_gb() < 45:
        pytest.skip(f"needs about 45 GiB of free GPU memory, {_free_gb():.0f} free")
    b, h, n, d = 67, 256, 1000, 128  # 2**31 + 48.4M elements each
    q, k, v = (_normal(b, h, n, d, seed=10 + s) for s in range(3))
    assert q.numel() > LIMIT
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    out, lse = fa2gen.attention(q, k, v, causal=True, return_lse=True)
    dout = _normal(b, h, n, d, seed=13)
    out.backward(dout)
    torch.cuda.synchronize()
    for bi, hi in ((0, 0), (33, 128), (b - 1, h - 1)):  # the last head's offsets pass 2**31
        one = [t.detach()[bi : bi + 1, hi : hi + 1] for t in (q, k, v)]
        problem = make_problem(*one, causal=True)
        fwd = check_forward(*one, problem, out.detach()[bi : bi + 1, hi : hi + 1], lse[bi : bi + 1, hi : hi + 1])
        assert fwd.ok, f"forward of (batch {bi}, head {hi}): {fwd}"
        grads = (t.grad[bi : bi + 1, hi : hi + 1] for t in (q, k, v))
        bwd = check_backward(*one, problem, dout[bi : bi + 1, hi : hi + 1], *grads)
        assert bwd.ok, f"backward of (batch {bi}, head {hi}): {bwd}"
