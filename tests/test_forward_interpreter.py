"""The generated forward kernel under Triton's interpreter, judged by flash-attention's rule."""

import sys
import zlib

import pytest
import torch
from helpers import MASK_CASES, ODD_SHAPES, rand_qkv, run_and_check

from fa2gen.generator.spec import TuningParams

pytestmark = pytest.mark.interpreter

P_SMALL = TuningParams(block_m=16, block_n=16, num_warps=4, num_stages=1, loads="pointer")
P_WIDE = TuningParams(block_m=32, block_n=64, num_warps=4, num_stages=2, loads="pointer")
P_TMA = TuningParams(block_m=64, block_n=32, num_warps=4, num_stages=2, loads="tma_host")
P_TMA_DEV = TuningParams(block_m=32, block_n=64, num_warps=4, num_stages=2, loads="tma_device")
POINTS = [P_SMALL, P_WIDE, P_TMA, P_TMA_DEV]

SHAPES = ODD_SHAPES
MASKS = MASK_CASES


def _id(x):
    return "-".join(f"{k}={v}" for k, v in x.items()) or "full"


@pytest.mark.parametrize("params", POINTS, ids=lambda p: f"m{p.block_m}n{p.block_n}{p.loads}")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kw", MASKS, ids=_id)
def test_forward_matches_reference(params, shape, kw):
    q, k, v = rand_qkv(*shape, seed=zlib.crc32(repr((shape, _id(kw))).encode()) % 1000)
    verdict, out, lse = run_and_check(q, k, v, params, **kw)
    assert verdict.ok, str(verdict)


@pytest.mark.parametrize("params", [P_WIDE, P_TMA, P_TMA_DEV], ids=["pointer", "tma_host", "tma_device"])
@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"window_size": (5, 5)}], ids=_id)
def test_bf16(params, kw):
    q, k, v = rand_qkv(2, 2, 1, 41, 58, 80, dtype=torch.bfloat16, seed=3)
    verdict, _, _ = run_and_check(q, k, v, params, **kw)
    assert verdict.ok, str(verdict)


@pytest.mark.parametrize("params", [P_SMALL, P_TMA, P_TMA_DEV], ids=["pointer", "tma_host", "tma_device"])
def test_strided_bnhd_layout(params):
    # (B, N, H, D) storage seen as (B, H, N, D): no copy needed, output keeps the layout.
    q, k, v = rand_qkv(2, 4, 2, 29, 40, 64, layout="bnhd", seed=5)
    assert not q.is_contiguous()
    verdict, out, _ = run_and_check(q, k, v, params, causal=True)
    assert verdict.ok, str(verdict)
    assert out.stride() == q.stride()


def test_rows_without_keys_are_zero_with_neg_inf_lse():
    # Causal with Nq > Nk: the first Nq - Nk rows see no key; a narrow window also empties rows.
    q, k, v = rand_qkv(1, 2, 2, 40, 17, 64, seed=7)
    verdict, out, lse = run_and_check(q, k, v, P_SMALL, causal=True)
    assert verdict.ok, str(verdict)
    assert torch.all(out[:, :, :23] == 0) and torch.all(torch.isneginf(lse[:, :, :23]))
    assert torch.isfinite(lse[:, :, 23:]).all()
    q, k, v = rand_qkv(1, 1, 1, 30, 30, 32, seed=8)
    verdict, out, lse = run_and_check(q, k, v, P_SMALL, window_size=(0, 0), causal=False)
    assert verdict.ok, str(verdict)


def test_every_d_multiple_of_8_small_sample():
    for d in (16, 24, 40, 48, 96, 160):
        q, k, v = rand_qkv(1, 1, 1, 21, 26, d, seed=d)
        verdict, _, _ = run_and_check(q, k, v, P_SMALL, causal=bool(d % 16))
        assert verdict.ok, f"D={d}: {verdict}"


def test_checker_catches_a_wrong_kernel():
    """The criterion must fail a plausible bug (the scale left out) and NaN output."""
    from fa2gen.bench.correctness import check_forward
    from fa2gen.runtime.launch import forward
    from fa2gen.runtime.problem import make_problem

    q, k, v = rand_qkv(1, 2, 2, 33, 33, 64, seed=11)
    problem = make_problem(q, k, v)
    wrong = make_problem(q, k, v, sm_scale=1.0)
    out, lse = forward(q, k, v, wrong, P_SMALL)
    assert not check_forward(q, k, v, problem, out, lse).ok
    out, lse = forward(q, k, v, problem, P_SMALL)
    out[0, 0, 5, 3] = float("nan")
    assert "NaN" in check_forward(q, k, v, problem, out, lse).reason


@pytest.mark.parametrize("window", [(0, 2**31 - 1), (sys.maxsize, 3), (2**40, 2**40)])
def test_huge_window_extents_mean_unbounded(window):
    q, k, v = rand_qkv(1, 2, 2, 37, 45, 32, seed=12)
    verdict, out, _ = run_and_check(q, k, v, P_SMALL, window_size=window)
    assert verdict.ok, str(verdict)


def test_row_offsets_past_2_to_the_31():
    """K rows 2**31 elements apart: 32-bit row offsets would wrap (and read far out of bounds)."""
    stride = 2**31 + 128
    storage = torch.empty(stride + 64, dtype=torch.float16)  # untouched pages cost no memory
    k = storage.as_strided((1, 1, 2, 64), (0, 0, stride, 1))
    v = storage.as_strided((1, 1, 2, 64), (0, 0, stride, 1))
    k[0, 0].copy_(torch.randn(2, 64).half())
    q = torch.randn(1, 1, 3, 64).half()
    verdict, _, _ = run_and_check(q, k, v, P_SMALL)
    assert verdict.ok, str(verdict)


@pytest.mark.parametrize("params", [P_SMALL, P_TMA, P_TMA_DEV], ids=["pointer", "tma_host", "tma_device"])
@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"window_size": (9, 4)}], ids=_id)
def test_persistent_grid_is_bit_identical(params, kw):
    """A persistent grid (here 3 or 6 programs, the interpreter's stand-in SM count times
    the knob) computes each tile exactly as the one-program-per-tile grid does, in another
    order: every output and lse bit the same, whatever the tiles per program."""
    q, k, v = rand_qkv(2, 4, 2, 45, 77, 32, seed=11)
    _, out, lse = run_and_check(q, k, v, params, **kw)
    for persistent in (1, 2):
        verdict, out_p, lse_p = run_and_check(q, k, v, params.replace(persistent=persistent), **kw)
        assert verdict.ok, verdict
        assert torch.equal(out, out_p) and torch.equal(lse, lse_p)
