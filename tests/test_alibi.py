"""ALiBi (alibi_slopes): the generated kernels' forward and backward against the reference with
the bias, dense, packed and over a KV cache, and the checks of the slopes."""

import dataclasses

import pytest
import torch
from helpers import MASK_CASES, ODD_SHAPES, rand_qkv
from test_kvcache import cache_inputs
from test_varlen import packed

import fa2gen
from fa2gen.bench.correctness import check_backward, check_cache, check_forward
from fa2gen.generator.spec import KernelSpec, SpecError, TuningParams
from fa2gen.runtime.backward import backward
from fa2gen.runtime.defaults import decode_default
from fa2gen.runtime.kvcache import CacheLaunch, cache_forward
from fa2gen.runtime.launch import forward
from fa2gen.runtime.problem import check_alibi, make_kvcache_problem, make_problem, make_varlen_problem
from fa2gen.runtime.varlen import varlen_reference


def slopes_for(batch: int, heads: int, per_batch: bool, seed: int = 0) -> torch.Tensor:
    # ALiBi's geometric slopes, jittered per batch so that a mixed-up row shows
    g = torch.Generator().manual_seed(seed)
    base = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)])
    return base * (1 + torch.rand(batch, heads, generator=g)) if per_batch else base


def check_both_passes(q, k, v, dout, slopes, options):
    """attention() with ``slopes``, forward and backward, judged against the reference with the
    bias by flash-attention's rule; (problem, out, lse)."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, lse = fa2gen.attention(*leaves, return_lse=True, alibi_slopes=slopes, **options)
    out.backward(dout)
    problem = make_problem(q, k, v, **options)
    verdict = check_forward(q, k, v, problem, out.detach(), lse, alibi=slopes)
    assert verdict.ok, str(verdict)
    verdict = check_backward(q, k, v, problem, dout, *(t.grad for t in leaves), alibi=slopes)
    assert verdict.ok, str(verdict)
    return problem, out.detach(), lse


@pytest.mark.interpreter
@pytest.mark.parametrize("per_batch", [False, True], ids=["per-head", "per-batch"])
@pytest.mark.parametrize("options", MASK_CASES[:6], ids=str)
def test_attention_with_alibi_matches_the_reference_forward_and_backward(options, per_batch):
    shape = ODD_SHAPES[1]  # (2, 4, 2, 45, 77, 32): GQA, Nq != Nk
    q, k, v = rand_qkv(*shape, seed=3)
    slopes = slopes_for(shape[0], shape[1], per_batch)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(5)).to(q.dtype)
    problem, out, lse = check_both_passes(q, k, v, dout, slopes, options)
    # the bias is there: the reference without it disagrees
    assert not check_forward(q, k, v, problem, out, lse).ok


@pytest.mark.interpreter
@pytest.mark.parametrize("shape", ODD_SHAPES, ids=str)
@pytest.mark.parametrize(
    "params",
    [
        TuningParams(32, 32, 4, 1, "pointer"),
        TuningParams(32, 16, 4, 1, "tma_host"),
        TuningParams(16, 32, 4, 1, "tma_device"),
    ],
    ids=lambda p: p.label(),
)
def test_every_forward_load_path_adds_the_bias(shape, params):
    q, k, v = rand_qkv(*shape, dtype=torch.bfloat16, seed=sum(shape))
    slopes = slopes_for(shape[0], shape[1], per_batch=True)
    problem = make_problem(q, k, v, causal=True)
    problem = dataclasses.replace(problem, alibi=True)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((shape[0], shape[1], shape[3]), float("nan"))
    forward(q, k, v, problem, params, out=out, lse=lse, alibi=check_alibi(slopes, problem, q.device))
    verdict = check_forward(q, k, v, problem, out, lse, alibi=slopes)
    assert verdict.ok, str(verdict)


@pytest.mark.interpreter
@pytest.mark.parametrize("dq_mode", ["separate", "atomic"])
def test_both_dq_forms_of_the_backward_add_the_bias(dq_mode):
    q, k, v = rand_qkv(1, 3, 1, 70, 33, 80, seed=4)
    slopes = slopes_for(1, 3, per_batch=False)
    problem = make_problem(q, k, v, window_size=(20, 3))
    problem = dataclasses.replace(problem, alibi=True)
    alibi = check_alibi(slopes, problem, q.device)
    out, lse = forward(q, k, v, problem, TuningParams(32, 32, 4, 1), alibi=alibi)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(2)).to(q.dtype)
    grads = backward(q, k, v, out, lse, dout, problem, TuningParams(32, 16, 4, 1, dq_mode=dq_mode), alibi=alibi)
    verdict = check_backward(q, k, v, problem, dout, *grads, alibi=slopes)
    assert verdict.ok, str(verdict)


@pytest.mark.interpreter
def test_a_packed_batch_takes_a_slope_row_per_sequence():
    lq, lk = [5, 0, 1, 37, 19], [9, 3, 0, 37, 70]
    q, k, v, cq, ck = packed(lq, lk, Hq=4, Hkv=2, D=40, seed=6)
    slopes = slopes_for(len(lq), 4, per_batch=True, seed=1)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = fa2gen.attention_varlen(*leaves, cq, ck, 37, 70, causal=True, alibi_slopes=slopes, return_lse=True)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(4)).to(q.dtype)
    out.backward(dout)
    problem = make_varlen_problem(q, k, v, cq, ck, 37, 70, causal=True)
    exact = [t.float().requires_grad_() for t in (q, k, v)]
    ref, ref_lse = varlen_reference(*exact, cq, ck, problem, alibi=slopes)
    ref.backward(dout.float())
    base = [t.clone().requires_grad_() for t in (q, k, v)]
    pytorch, _ = varlen_reference(*base, cq, ck, problem, compute_dtype=q.dtype, alibi=slopes)
    pytorch.backward(dout)
    assert (out.float() - ref).abs().max() <= 2 * (pytorch.float() - ref).abs().max() + 1e-4
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse)) and (lse[finite] - ref_lse[finite]).abs().max() < 1e-4
    for name, got, want, torch_grad in zip("qkv", leaves, exact, base):
        err = (got.grad.float() - want.grad).abs().max()
        assert err <= 2 * (torch_grad.grad.float() - want.grad).abs().max() + 1e-4, f"d{name}: {err:.2e}"


@pytest.mark.interpreter
@pytest.mark.parametrize("splits", [0, 1, 4], ids=["through-the-api", "one-split", "four-splits"])
def test_the_decode_kernels_add_the_bias_per_query_head(splits):
    inputs = cache_inputs(2, 3, 6, 2, 40, 96, [50, 7], page=16, new=2, seed=8)
    slopes = slopes_for(2, 6, per_batch=True, seed=2)
    q, kc, vc, lens, table, k, v = inputs
    before = (q, kc.clone(), vc.clone(), lens, table, k, v)
    problem = dataclasses.replace(make_kvcache_problem(*before, causal=True), alibi=True)
    if splits:
        params = decode_default(problem.kernel_spec("decode"), "cpu", 12, 4).replace(splits=splits)
        launch = CacheLaunch(problem, params, 3)
        alibi = check_alibi(slopes, problem, q.device)
        out, lse = cache_forward(*inputs, problem, params, launch=launch, alibi=alibi)
        assert launch.splits == splits
    else:
        out, lse = fa2gen.attention_with_kvcache(
            q, kc, vc, lens, block_table=table, k=k, v=v, causal=True, alibi_slopes=slopes, return_lse=True
        )
    verdict = check_cache(before, problem, out, lse, (kc, vc), alibi=slopes)
    assert verdict.ok, str(verdict)
    assert not check_cache(before, problem, out, lse, (kc, vc)).ok


def test_slopes_are_checked_by_name():
    q, k, v = rand_qkv(2, 4, 2, 9, 9, 16)
    problem = make_problem(q, k, v)
    assert check_alibi(None, problem, q.device) is None
    assert check_alibi(torch.ones(4), problem, q.device)[1] == 0
    assert check_alibi(torch.ones(2, 4), problem, q.device)[1] == 4
    for bad, error, match in (
        ([1.0] * 4, TypeError, "alibi_slopes must be a torch.Tensor"),
        (torch.ones(4, dtype=torch.float16), ValueError, "float32 of shape"),
        (torch.ones(3, 4), ValueError, r"\(4,\) or \(2, 4\)"),
        (torch.ones(2, 8)[:, ::2], ValueError, "contiguous heads"),
        (torch.ones(4, device="meta"), ValueError, "alibi_slopes is on meta"),
    ):
        with pytest.raises(error, match=match):
            check_alibi(bad, problem, q.device)
    with pytest.raises(ValueError, match="alibi_slopes must be float32"):
        fa2gen.attention(q, k, v, alibi_slopes=torch.ones(4, dtype=torch.float64))


def test_alibi_is_its_own_kernel_in_the_triton_templates_only():
    spec = KernelSpec(dtype="bf16", head_dim=64, alibi=True)
    assert "alibi" in spec.to_dict() and "alibi" not in KernelSpec().to_dict()
    with pytest.raises(SpecError, match="fp16 or bf16"):
        KernelSpec(dtype="fp8e4m3", alibi=True)
    from fa2gen.generator.spec import unsupported

    assert (
        unsupported(spec, TuningParams(64, 64, 4, 3, "tma_host", gluon=1))
        == "ALiBi and dropout run in the Triton template (gluon=0)"
    )
    assert unsupported(spec, TuningParams(64, 64, 4, 3, "tma_host")) is None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("options", [{}, {"causal": True}, {"window_size": (200, 0), "softcap": 30.0}], ids=str)
def test_alibi_on_the_gpu_forward_and_backward(dtype, options):
    q, k, v = rand_qkv(2, 8, 2, 1000, 1337, 128, dtype=dtype, device="cuda", seed=7)
    slopes = slopes_for(2, 8, per_batch=True).cuda()
    dout = torch.randn(q.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1)).to(dtype)
    check_both_passes(q, k, v, dout, slopes, options)


@pytest.mark.gpu
def test_alibi_on_the_gpu_over_a_split_paged_cache():
    inputs = cache_inputs(4, 4, 8, 2, 128, 4096, [0, 1, 4092, 1999], page=16, new=4, device="cuda", seed=3)
    slopes = slopes_for(4, 8, per_batch=True).cuda()
    q, kc, vc, lens, table, k, v = inputs
    before = (q, kc.clone(), vc.clone(), lens, table, k, v)
    out, lse = fa2gen.attention_with_kvcache(
        q, kc, vc, lens, block_table=table, k=k, v=v, causal=True, alibi_slopes=slopes, return_lse=True
    )
    problem = dataclasses.replace(make_kvcache_problem(*before, causal=True), alibi=True)
    verdict = check_cache(before, problem, out, lse, (kc, vc), alibi=slopes)
    assert verdict.ok, str(verdict)


@pytest.mark.gpu
def test_alibi_on_the_gpu_over_a_packed_batch():
    lq = lk = [0, 1, 4096, 777]
    q, k, v, cq, ck = packed(lq, lk, Hq=8, Hkv=2, D=128, dtype=torch.bfloat16, device="cuda", seed=2)
    slopes = slopes_for(4, 8, per_batch=True).cuda()
    out, lse = fa2gen.attention_varlen(q, k, v, cq, ck, 4096, 4096, causal=True, alibi_slopes=slopes, return_lse=True)
    problem = make_varlen_problem(q, k, v, cq, ck, 4096, 4096, causal=True)
    ref, _ = varlen_reference(q.float(), k.float(), v.float(), cq, ck, problem, alibi=slopes)
    pytorch, _ = varlen_reference(q, k, v, cq, ck, problem, compute_dtype=q.dtype, alibi=slopes)
    assert not out.isnan().any()
    assert (out.float() - ref).abs().max() <= 2 * (pytorch.float() - ref).abs().max() + 1e-4


def test_plain_packed_and_alibi_calls_of_one_bucket_are_chosen_apart(monkeypatch):
    """The dispatch memo keys a choice by bucket and by whether the call is packed or has ALiBi:
    a plain call's tuned (maybe Gluon) config never reaches a kernel that cannot run it."""
    from fa2gen.runtime import dispatch

    asked = []
    monkeypatch.setattr(dispatch, "choose", lambda problem, device, direction: asked.append(problem) or "choice")
    dispatch.clear_memo()
    q, k, v = rand_qkv(1, 2, 2, 64, 64, 64)
    plain = make_problem(q, k, v)
    for problem in (plain, dataclasses.replace(plain, alibi=True), dataclasses.replace(plain, varlen=True), plain):
        assert dispatch.explain(problem, None) == "choice"
    assert [(p.alibi, p.varlen) for p in asked] == [(False, False), (True, False), (False, True)]
    dispatch.clear_memo()


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("extra", ["alibi", "dropout"])
def test_a_packed_call_with_alibi_or_dropout_gets_an_sm90_default_that_runs_it(extra, head_dim):
    """Buckets do not record ALiBi or dropout, whose calls take the bucket's default: built for
    the call's own kernel, never the packed batch's Gluon default, which cannot run them."""
    from fa2gen.generator.spec import unsupported
    from fa2gen.runtime.device import DeviceInfo
    from fa2gen.runtime.lookup import choose

    q, k, v, cq, ck = packed([0, 1, 4096, 777], [0, 1, 4096, 777], Hq=8, Hkv=2, D=head_dim, seed=2)
    plain = make_varlen_problem(q, k, v, cq, ck, 4096, 4096, causal=True)
    h100 = DeviceInfo("NVIDIA H100 80GB HBM3", (9, 0), "sm90", 132)
    problem = dataclasses.replace(plain, **{extra: True})
    for direction in ("fwd", "bwd"):
        choice = choose(problem, h100, direction)
        assert choice.source == "default"
        assert unsupported(problem.kernel_spec(direction), choice.params) is None, (direction, choice.params)
