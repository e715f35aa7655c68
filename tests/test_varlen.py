"""Packed batches (attention_varlen): the generated kernel against the reference, one sequence
at a time, and the checks of its arguments."""

import pytest
import torch
from helpers import MASK_CASES

import fa2gen
from fa2gen.bench.correctness import ATOL, check_forward
from fa2gen.generator.descriptors.attn_bwd_gluon import AttnBwdGluon
from fa2gen.generator.spec import KernelSpec, TuningParams
from fa2gen.runtime.backward import BackwardLaunch
from fa2gen.runtime.dispatch import select_params
from fa2gen.runtime.launch import Launch
from fa2gen.runtime.problem import make_problem, make_varlen_problem
from fa2gen.runtime.varlen import varlen_backward, varlen_forward, varlen_reference


def packed(lengths_q, lengths_k, Hq, Hkv, D, dtype=torch.float16, device="cpu", seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rows(n, H):
        return torch.randn(n, H, D, generator=g).to(dtype).to(device)

    def offsets(lengths):
        return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)

    k = rows(sum(lengths_k), Hkv)
    return rows(sum(lengths_q), Hq), k, rows(sum(lengths_k), Hkv), offsets(lengths_q), offsets(lengths_k)


def check_each_sequence(q, k, v, cq, ck, out, lse, options):
    """Each sequence judged as a dense call by flash-attention's rule; a sequence without keys
    returns zeros and lse -inf."""
    cq, ck = cq.tolist(), ck.tolist()
    for i in range(len(cq) - 1):
        (q0, q1), (k0, k1) = (cq[i], cq[i + 1]), (ck[i], ck[i + 1])
        if q1 == q0:
            continue
        if k1 == k0:
            assert not out[q0:q1].any() and torch.isneginf(lse[:, q0:q1]).all(), f"sequence {i}"
            continue
        qs, ks, vs = (t[a:z].permute(1, 0, 2)[None] for t, (a, z) in ((q, (q0, q1)), (k, (k0, k1)), (v, (k0, k1))))
        verdict = check_forward(
            qs, ks, vs, make_problem(qs, ks, vs, **options), out[q0:q1].permute(1, 0, 2)[None], lse[None, :, q0:q1]
        )
        assert verdict.ok, f"sequence {i} ({q1 - q0} queries, {k1 - k0} keys): {verdict}"


def forward_checked(q, k, v, cq, ck, problem, params, options, launch=None):
    """varlen_forward into NaN-poisoned outputs, judged sequence by sequence."""
    out = torch.full_like(q, float("nan"))
    lse = torch.full((q.shape[1], q.shape[0]), float("nan"), device=q.device)
    varlen_forward(q, k, v, cq, ck, problem, params, out=out, lse=lse, launch=launch)
    check_each_sequence(q, k, v, cq, ck, out, lse, options)


# lengths 0 and 1, queries longer and shorter than keys, totals that are no multiple of a block
LENGTHS = [([5, 0, 1, 37, 19], [9, 3, 0, 37, 70]), ([1, 64, 33], [1, 64, 100])]


@pytest.mark.interpreter
@pytest.mark.parametrize("options", MASK_CASES, ids=str)
@pytest.mark.parametrize("lengths", LENGTHS, ids=["mixed", "short"])
def test_a_packed_batch_matches_each_sequence_alone(lengths, options):
    q, k, v, cq, ck = packed(*lengths, Hq=4, Hkv=2, D=72)
    problem = make_varlen_problem(q, k, v, cq, ck, max(lengths[0]), max(lengths[1]), **options)
    forward_checked(q, k, v, cq, ck, problem, select_params(problem, None), options)


@pytest.mark.interpreter
@pytest.mark.parametrize("options", MASK_CASES[:6], ids=str)
def test_in_kernel_descriptors_stop_at_each_sequences_end(options):
    # Each sequence's descriptors are built at its first row with its own length: rows past
    # its end read as 0 and are never written, so the neighbours' rows stay out.
    lengths = LENGTHS[0]
    q, k, v, cq, ck = packed(*lengths, Hq=4, Hkv=2, D=72, seed=5)
    problem = make_varlen_problem(q, k, v, cq, ck, max(lengths[0]), max(lengths[1]), **options)
    params = TuningParams(16, 32, 4, 1, "tma_device")
    launch = Launch(problem, params)
    forward_checked(q, k, v, cq, ck, problem, params, options, launch)
    assert launch.module is not None, "the launch fell back to pointer loads"


@pytest.mark.interpreter
@pytest.mark.parametrize("D, dtype", [(64, torch.bfloat16), (128, torch.float16), (40, torch.bfloat16)])
def test_attention_varlen_returns_out_and_lse_for_strided_inputs(D, dtype):
    lq, lk = [3, 17, 0, 30], [40, 17, 5, 2]
    q, k, v, cq, ck = packed(lq, lk, Hq=3, Hkv=1, D=D, dtype=dtype, seed=1)
    q = torch.cat([q, q], dim=1)[:, ::2]  # heads strided: any strides with a contiguous last dim
    out, lse = fa2gen.attention_varlen(q, k, v, cq, ck, 30, 40, causal=True, return_lse=True, validate=True)
    assert out.shape == q.shape and lse.shape == (3, q.shape[0]) and lse.dtype == torch.float32
    check_each_sequence(q, k, v, cq, ck, out, lse, {"causal": True})


def _args(**change):
    q, k, v, cq, ck = packed([3, 4], [5, 2], Hq=2, Hkv=2, D=16)
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=4, max_seqlen_k=5)
    args.update(change)
    return args


@pytest.mark.parametrize(
    "change, error, match",
    [
        (dict(q=torch.zeros(1, 7, 2, 16, dtype=torch.float16)), ValueError, "q must have 3 dims"),
        (dict(cu_seqlens_q=torch.tensor([0, 3, 7])), ValueError, "cu_seqlens_q must be a 1-D int32"),
        (dict(cu_seqlens_k=torch.tensor([0, 7], dtype=torch.int32)), ValueError, "one offset per sequence"),
        (dict(max_seqlen_q=8), ValueError, "max_seqlen_q must be in"),
        (dict(max_seqlen_k=2.0), TypeError, "max_seqlen_k must be an int"),
        (dict(k=torch.zeros(7, 2, 16, dtype=torch.bfloat16)), TypeError, "k has dtype"),
    ],
)
def test_bad_arguments_are_refused_by_name(change, error, match):
    with pytest.raises(error, match=match):
        fa2gen.attention_varlen(**_args(**change))


@pytest.mark.parametrize(
    "offsets, longest, match",
    [
        ([1, 3, 7], 4, "must start at 0"),
        ([0, 5, 3], 5, "never decrease"),
        ([0, 3, 6], 4, "end at 7"),
        ([0, 1, 7], 4, "sequence of 6 rows, more than its max_seqlen 4"),
    ],
)
def test_validate_reads_the_offsets(offsets, longest, match):
    args = _args(cu_seqlens_q=torch.tensor(offsets, dtype=torch.int32), max_seqlen_q=longest)
    with pytest.raises(ValueError, match=match):
        fa2gen.attention_varlen(**args, validate=True)


def check_gradients(q, k, v, cq, ck, problem, options, dout):
    """attention_varlen's gradients against the fp32 reference's, by flash-attention's rule:
    each error at most twice PyTorch's own in the inputs' dtype, plus a small atol."""
    kernel = [t.clone().requires_grad_() for t in (q, k, v)]
    fa2gen.attention_varlen(*kernel, cq, ck, problem.seqlen_q, problem.seqlen_k, **options).backward(dout)
    exact = [t.float().requires_grad_() for t in (q, k, v)]
    varlen_reference(*exact, cq, ck, problem)[0].backward(dout.float())
    base = [t.clone().requires_grad_() for t in (q, k, v)]
    varlen_reference(*base, cq, ck, problem, compute_dtype=q.dtype)[0].backward(dout)
    for name, got, ref, pytorch in zip(("dq", "dk", "dv"), kernel, exact, base):
        err = (got.grad.float() - ref.grad).abs().max().item()
        allowed = 2 * (pytorch.grad.float() - ref.grad).abs().max().item() + ATOL
        assert err <= allowed, f"{name}: error {err:.2e} > {allowed:.2e}"


@pytest.mark.interpreter
@pytest.mark.parametrize("options", MASK_CASES[:6], ids=str)
def test_a_packed_batchs_gradients_match_the_reference(options):
    lengths = LENGTHS[0]
    q, k, v, cq, ck = packed(*lengths, Hq=4, Hkv=2, D=40, seed=3)
    problem = make_varlen_problem(q, k, v, cq, ck, max(lengths[0]), max(lengths[1]), **options)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(4)).to(q.dtype)
    check_gradients(q, k, v, cq, ck, problem, options, dout)


@pytest.mark.interpreter
@pytest.mark.parametrize("options", MASK_CASES[:6], ids=str)
def test_a_packed_batchs_dq_sums_by_row_match_the_reference(options):
    """dq_mode atomic on a packed batch: the dK/dV kernel adds each key block's share of dQ into
    fp32 sums by packed row, and one pass scales and casts every packed row; the offsets hold
    sequences of 0 and 1 rows and a sequence without keys."""
    lengths = LENGTHS[0]
    q, k, v, cq, ck = packed(*lengths, Hq=4, Hkv=2, D=40, seed=5)
    problem = make_varlen_problem(q, k, v, cq, ck, max(lengths[0]), max(lengths[1]), **options)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(6)).to(q.dtype)
    params = TuningParams(32, 16, 4, 1, dq_mode="atomic")
    backward_checked(q, k, v, cq, ck, problem, params, dout, BackwardLaunch(problem, params))


def test_the_sm90_default_of_a_packed_d64_backward_is_the_one_pass_unless_deterministic():
    from fa2gen.generator.spec import unsupported
    from fa2gen.runtime.defaults import default_params

    for mask in ("none", "causal"):
        spec = KernelSpec(direction="bwd", head_dim=64, mask=mask, dtype="bf16", varlen=True)
        one_pass, plain = (default_params(spec, "sm90", 2048, atomics=a) for a in (True, False))
        assert (one_pass.dq_mode, one_pass.gluon, one_pass.loads) == ("atomic", 1, "tma_device")
        assert plain.dq_mode == "separate" and unsupported(spec, plain) is None
    local = KernelSpec(direction="bwd", head_dim=64, mask="local", dtype="bf16", varlen=True)
    assert default_params(local, "sm90", 2048).dq_mode == "separate"  # (the Gluon kernels take no window)


@pytest.mark.interpreter
@pytest.mark.parametrize("how", ["flag", "torch", "neither"])
def test_a_deterministic_packed_backward_never_adds_dq_with_atomics(monkeypatch, how):
    """A tuned packed backward may add dQ with atomics; deterministic=True, or torch's global
    switch, runs dQ in its own kernel instead."""
    import fa2gen.runtime.autograd as autograd
    from fa2gen.runtime import dispatch

    dispatch.clear_memo()
    atomic = TuningParams(32, 16, 4, 1, dq_mode="atomic")
    monkeypatch.setattr(autograd, "select_params", lambda problem, device, direction: atomic)
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: how == "torch")
    built, real = [], autograd.BackwardLaunch
    monkeypatch.setattr(autograd, "BackwardLaunch", lambda problem, p: built.append(p) or real(problem, p))
    lengths = LENGTHS[1]
    q, k, v, cq, ck = packed(*lengths, Hq=4, Hkv=2, D=32, seed=7)
    problem = make_varlen_problem(q, k, v, cq, ck, max(lengths[0]), max(lengths[1]), causal=True)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(8)).to(q.dtype)
    check_gradients(q, k, v, cq, ck, problem, {"causal": True, "deterministic": how == "flag"}, dout)
    assert [p.dq_mode for p in built] == ["atomic" if how == "neither" else "separate"]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("options", [{}, {"causal": True}, {"window_size": (100, 0)}], ids=str)
def test_a_packed_batch_on_the_gpu_mixing_lengths_0_1_and_4k(dtype, options):
    lq, lk = [0, 1, 4096, 777, 1], [5, 1, 4096, 1000, 0]
    q, k, v, cq, ck = packed(lq, lk, Hq=8, Hkv=2, D=128, dtype=dtype, device="cuda", seed=2)
    out, lse = fa2gen.attention_varlen(q, k, v, cq, ck, max(lq), max(lk), return_lse=True, **options)
    check_each_sequence(q, k, v, cq, ck, out, lse, options)
    problem = make_varlen_problem(q, k, v, cq, ck, max(lq), max(lk), **options)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(4)).to(dtype).cuda()
    check_gradients(q, k, v, cq, ck, problem, options, dout)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 72, 128])
@pytest.mark.parametrize("options", [{}, {"causal": True}, {"window_size": (100, 0)}], ids=str)
def test_in_kernel_descriptors_on_the_gpu_stop_at_each_sequences_end(D, options):
    # lengths 0 and 1, totals that are no multiple of a block, a sequence past 4k
    lq, lk = [0, 1, 4096, 777, 1, 333], [5, 1, 4096, 1000, 0, 129]
    q, k, v, cq, ck = packed(lq, lk, Hq=8, Hkv=2, D=D, dtype=torch.bfloat16, device="cuda", seed=6)
    problem = make_varlen_problem(q, k, v, cq, ck, max(lq), max(lk), **options)
    for params in (TuningParams(128, 64, 8, 2, "tma_device"), TuningParams(64, 64, 4, 3, "tma_device")):
        launch = Launch(problem, params)
        forward_checked(q, k, v, cq, ck, problem, params, options, launch)
        assert launch.module is not None, "the launch fell back to pointer loads"


@pytest.mark.interpreter
def test_a_launch_refuses_a_batch_its_grid_does_not_cover():
    """A packed launch's grid is its batch's sequences by their longest: a call with other
    sequences, or longer ones, is refused before anything runs (fewer sequences would read
    offsets past cu_seqlens' end; more, or longer, would leave rows unwritten)."""
    q, k, v, cq, ck = packed([5, 9], [5, 9], Hq=2, Hkv=2, D=16)
    launch = Launch(make_varlen_problem(q, k, v, cq, ck, 9, 9), TuningParams(16, 16, 4, 1))
    backward = BackwardLaunch(launch.problem, TuningParams(16, 16, 4, 1))
    varlen_forward(q, k, v, cq, ck, launch.problem, launch.params, launch=launch)  # (the batch it was built for)
    for lengths, longest in (([5, 4, 5], 5), ([4, 10], 10)):
        q, k, v, cq, ck = packed(lengths, lengths, Hq=2, Hkv=2, D=16)
        other = make_varlen_problem(q, k, v, cq, ck, longest, longest)
        with pytest.raises(ValueError, match="launch: built for 2 sequences of at most 9 queries"):
            varlen_forward(q, k, v, cq, ck, other, launch.params, launch=launch)
        out, lse = torch.zeros_like(q), torch.zeros(2, q.shape[0])
        with pytest.raises(ValueError, match="launch: built for 2 sequences"):
            varlen_backward(q, k, v, out, lse, torch.ones_like(q), cq, ck, other, backward)


# Two packed batches that one launch runs in turn: lengths 0 and 1, a sequence without keys,
# more queries than keys and fewer, one past 4k. (A launch is built for one number of
# sequences and one packed total: its grid covers that many sequences.)
GLUON_BATCHES = [
    ([0, 1, 4096, 777, 1, 333], [5, 1, 4096, 1000, 0, 129]),
    ([300, 4100, 0, 800, 7, 1], [300, 4000, 7, 900, 0, 24]),
]
GLUON_VARLEN = [
    TuningParams(128, 128, 8, 3, "tma_device", gluon=2),
    TuningParams(128, 128, 8, 2, "tma_device", gluon=2),
    TuningParams(128, 64, 8, 3, "tma_device", gluon=2),
    TuningParams(64, 64, 4, 3, "tma_device", gluon=1),
    # one program an SM, taking tiles from the queue and skipping the empty ones
    TuningParams(128, 128, 8, 2, "tma_device", persistent=1, gluon=2),
    TuningParams(128, 128, 8, 3, "tma_device", persistent=1, gluon=2),
]


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("options", [{}, {"causal": True}], ids=str)
@pytest.mark.parametrize("params", GLUON_VARLEN, ids=lambda p: p.label())
def test_the_gluon_forward_on_a_packed_batch(D, options, params):
    """Each call's descriptors cover its own sequences: two calls of one launch with other
    offsets (a descriptor built in the kernel lives where the last call's did) are both right.
    Lengths 0 and 1, a sequence without keys, more queries than keys, GQA, a sequence past 4k."""
    launch = None
    for seed, (lq, lk) in enumerate(GLUON_BATCHES):
        q, k, v, cq, ck = packed(lq, lk, Hq=8, Hkv=2, D=D, dtype=torch.bfloat16, device="cuda", seed=seed)
        problem = make_varlen_problem(q, k, v, cq, ck, 4100, 4096, **options)
        launch = launch or Launch(problem, params)
        forward_checked(q, k, v, cq, ck, problem, params, options, launch)
        assert launch.module is not None, "the launch fell back from the Gluon kernel"


def backward_checked(q, k, v, cq, ck, problem, params, dout, launch):
    """varlen_backward with ``params`` into NaN-poisoned gradients, from the fp32 reference's
    output and LSE, judged by flash-attention's rule against the fp32 reference's gradients."""
    exact = [t.float().requires_grad_() for t in (q, k, v)]
    ref_out, ref_lse = varlen_reference(*exact, cq, ck, problem)
    ref_out.backward(dout.float())
    base = [t.clone().requires_grad_() for t in (q, k, v)]
    varlen_reference(*base, cq, ck, problem, compute_dtype=q.dtype)[0].backward(dout)
    grads = {n: torch.full_like(t, float("nan")) for n, t in zip(("dq", "dk", "dv"), (q, k, v))}
    out = ref_out.detach().to(q.dtype)
    varlen_backward(q, k, v, out, ref_lse.detach(), dout, cq, ck, problem, launch, **grads)
    for (name, got), ref, pytorch in zip(grads.items(), exact, base):
        err = (got.float() - ref.grad).abs().max().item()
        allowed = 2 * (pytorch.grad.float() - ref.grad).abs().max().item() + ATOL
        assert err <= allowed, f"{name}: error {err:.2e} > {allowed:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("options", [{}, {"causal": True}], ids=str)
@pytest.mark.parametrize(
    "params", AttnBwdGluon().candidates(KernelSpec(direction="bwd", head_dim=128, varlen=True)), ids=lambda p: p.label()
)
def test_the_gluon_backward_on_a_packed_batch(D, options, params):
    """dK, dV (and dQ with gluon=2) by the Gluon kernels on descriptors built per sequence: keys
    of a sequence without queries get zero gradients, queries without keys too; two calls of one
    launch with other offsets."""
    launch = None
    for seed, (lq, lk) in enumerate(GLUON_BATCHES):
        q, k, v, cq, ck = packed(lq, lk, Hq=8, Hkv=2, D=D, dtype=torch.bfloat16, device="cuda", seed=seed)
        problem = make_varlen_problem(q, k, v, cq, ck, 4100, 4096, **options)
        dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed)).to(q.dtype).cuda()
        launch = launch or BackwardLaunch(problem, params)
        backward_checked(q, k, v, cq, ck, problem, params, dout, launch)
        assert launch._fallback is None, "the launch fell back from the Gluon kernels"


@pytest.mark.gpu
def test_a_deterministic_packed_backward_is_bit_identical_on_the_gpu():
    """D=64 packed backwards may add dQ with atomics (the one pass); deterministic=True gives
    the same bits twice, and its kept launch adds nothing with atomics."""
    from fa2gen.runtime import dispatch

    dispatch.clear_memo()
    lq, lk = [0, 1, 4096, 777, 1], [5, 1, 4096, 1000, 0]
    q, k, v, cq, ck = packed(lq, lk, Hq=8, Hkv=2, D=64, dtype=torch.bfloat16, device="cuda", seed=9)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(10)).to(q.dtype).cuda()
    grads = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        fa2gen.attention_varlen(*leaves, cq, ck, 4096, 4096, causal=True, deterministic=True).backward(dout)
        grads.append([t.grad for t in leaves])
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    [kept] = dispatch._launches.values()
    assert [p.params.dq_mode for p in kept.backward.values()] == ["separate"]


@pytest.mark.gpu
def test_repeated_packed_calls_keep_one_launch_and_read_each_calls_offsets():
    from fa2gen.runtime import dispatch

    dispatch.clear_memo()
    for seed, lengths in enumerate(([100, 3000, 7], [0, 3100, 7], [1, 1, 3105])):
        q, k, v, cq, ck = packed(lengths, lengths, Hq=8, Hkv=2, D=64, device="cuda", seed=seed)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        # (one bound for every call: the packed total, 3107, which no sequence passes)
        out, lse = fa2gen.attention_varlen(q, k, v, cq, ck, 3107, 3107, causal=True, return_lse=True)
        check_each_sequence(q.detach(), k.detach(), v.detach(), cq, ck, out.detach(), lse, {"causal": True})
        out.sum().backward()
        assert not any(t.grad.isnan().any() for t in (q, k, v))
    assert len(dispatch._launches) == 1
