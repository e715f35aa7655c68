"""Attention over a KV cache (attention_with_kvcache): the decode kernels against the reference,
contiguous and paged, with and without appending, split or not, and the checks of their
arguments."""

import pytest
import torch
from helpers import MASK_CASES, rand_qkv

import fa2gen
from fa2gen.bench.correctness import check_cache, check_forward
from fa2gen.runtime import api
from fa2gen.runtime.defaults import decode_combine, decode_default, decode_splits
from fa2gen.runtime.kvcache import CacheLaunch, cache_forward, kvcache_reference
from fa2gen.runtime.problem import make_kvcache_problem, make_problem


def cache_inputs(B, Sq, Hq, Hkv, D, capacity, lengths, *, page=0, new=0, dtype=torch.float16, device="cpu", seed=0):
    """q, k_cache, v_cache, cache_seqlens, block_table, k, v: random normal values; a paged
    cache gets its pages in a shuffled order, with spare pages no sequence owns."""
    g = torch.Generator().manual_seed(seed)

    def draw(*shape):
        return torch.randn(*shape, generator=g).to(dtype).to(device)

    q = draw(B, Sq, Hq, D)
    table = None
    if page:
        per = -(-capacity // page)
        kc, vc = draw(B * per + 2, page, Hkv, D), draw(B * per + 2, page, Hkv, D)
        table = torch.randperm(B * per + 2, generator=g)[: B * per].view(B, per).to(torch.int32).to(device)
    else:
        kc, vc = draw(B, capacity, Hkv, D), draw(B, capacity, Hkv, D)
    k = draw(B, new, Hkv, D) if new else None
    v = draw(B, new, Hkv, D) if new else None
    lens = torch.tensor(lengths, dtype=torch.int32, device=device)
    return q, kc, vc, lens, table, k, v


def check_cache_call(inputs, problem, out, lse, caches_after):
    """flash-attention's rule on out and lse (``correctness.check_cache``), NaN failing and -inf
    exactly where the reference has it; the appended caches equal to the reference's."""
    verdict = check_cache(inputs, problem, out, lse, caches_after)
    assert verdict.ok, str(verdict)


def run_cache(inputs, options, *, splits=None, combine="auto"):
    """The decode kernels on NaN-poisoned outputs, with ``splits`` forced (None: the default) and
    the partials combined by ``combine`` (a kernel of their own, or the last split)."""
    q, kc, vc, lens, table, k, v = inputs
    problem = make_kvcache_problem(q, kc, vc, lens, table, k, v, **options)
    arch = "cpu" if q.device.type == "cpu" else "sm90"
    streams = problem.batch * problem.heads_kv
    params = decode_default(problem.kernel_spec("decode"), arch, problem.seqlen_q * problem.group, streams)
    params = params.replace(combine=combine)
    if splits is not None:
        params = params.replace(splits=splits)
    kc_after, vc_after = kc.clone(), vc.clone()
    out = torch.full_like(q, float("nan"))
    sm_count = 3 if q.device.type == "cpu" else torch.cuda.get_device_properties(q.device).multi_processor_count
    launch = CacheLaunch(problem, params, sm_count)
    out, lse = cache_forward(q, kc_after, vc_after, lens, table, k, v, problem, params, launch=launch, out=out)
    return problem, out, lse, (kc_after, vc_after), launch


# (B, Sq, Hq, Hkv, D, capacity, lengths before the call, page size, new keys): lengths 0, 1 and
# full caches, GQA groups of 3 and 1, a padded head dim, pages partly filled
CASES = [
    (3, 1, 6, 2, 40, 70, [0, 1, 69], 0, 1),
    (2, 3, 4, 4, 64, 97, [97, 30], 0, 0),
    (3, 2, 6, 2, 40, 80, [0, 17, 78], 16, 2),
    (2, 5, 2, 1, 24, 128, [100, 3], 32, 5),
    (2, 2, 4, 2, 32, 144, [100, 5], 48, 3),  # a page size that is no power of two
    (1, 1, 2, 1, 16, 400, [390], 16, 0),  # by default three splits: the combine's tile padded to 4
]


@pytest.mark.interpreter
@pytest.mark.parametrize(
    "splits, combine",
    [(None, "kernel"), (1, "kernel"), (4, "kernel"), (None, "last"), (4, "last")],
    ids=["default", "one-split", "four-splits", "default-last-combines", "four-splits-last-combines"],
)
@pytest.mark.parametrize(
    "case", CASES, ids=["contiguous-append1", "contiguous", "paged16", "paged32-append5", "paged48", "paged16-long"]
)
def test_the_decode_kernels_match_the_reference(case, splits, combine):
    B, Sq, Hq, Hkv, D, cap, lengths, page, new = case
    inputs = cache_inputs(B, Sq, Hq, Hkv, D, cap, lengths, page=page, new=new, seed=sum(lengths))
    options = {"causal": True} if Sq > 1 else {}
    problem, out, lse, after, launch = run_cache(inputs, options, splits=splits, combine=combine)
    assert launch.splits == (splits or (3 if case is CASES[-1] else launch.splits))
    assert launch.combine_last == (combine == "last" and launch.splits > 1)
    check_cache_call(inputs, problem, out, lse, after)


@pytest.mark.interpreter
@pytest.mark.parametrize("combine", ["kernel", "last"])
@pytest.mark.parametrize("options", MASK_CASES, ids=str)
def test_every_mask_over_a_split_paged_cache(options, combine):
    inputs = cache_inputs(2, 4, 4, 2, 32, 96, [50, 7], page=16, new=3, dtype=torch.bfloat16, seed=5)
    problem, out, lse, after, _ = run_cache(inputs, options, splits=4, combine=combine)
    check_cache_call(inputs, problem, out, lse, after)


@pytest.mark.interpreter
def test_attention_with_kvcache_appends_and_returns_out_and_lse_for_strided_inputs():
    q, kc, vc, lens, table, k, v = cache_inputs(2, 2, 4, 2, 48, 64, [10, 0], page=16, new=2, seed=9)
    q = torch.cat([q, q], dim=2)[:, :, ::2]  # heads strided: any strides with a contiguous last dim
    before = (q, kc.clone(), vc.clone(), lens, table, k, v)
    out, lse = fa2gen.attention_with_kvcache(
        q, kc, vc, lens, block_table=table, k=k, v=v, causal=True, return_lse=True, validate=True
    )
    assert out.shape == q.shape and lse.shape == (2, 4, 2) and lse.dtype == torch.float32
    problem = make_kvcache_problem(*before, causal=True)
    check_cache_call(before, problem, out, lse, (kc, vc))


def _paged_layout(kc, vc, layout):
    """k_cache and v_cache with kc's and vc's values in another memory layout."""
    n, rows, h, d = kc.shape
    if layout == "interleaved":  # K's and V's pages side by side in one tensor
        kv = torch.stack([kc, vc], 1)
        return kv[:, 0], kv[:, 1]
    if layout == "padded":  # pages 8 elements longer than their rows: no whole number of rows apart

        def pad(t):
            buf = torch.zeros(n, rows * h * d + 8, dtype=t.dtype)
            buf[:, : rows * h * d] = t.reshape(n, -1)
            return buf[:, : rows * h * d].view(n, rows, h, d)

        return pad(kc), pad(vc)
    return kc.clone(), torch.stack([vc, vc], 1)[:, 0]  # "mixed": K and V pages strided apart unlike


@pytest.mark.interpreter
@pytest.mark.parametrize("layout", ["interleaved", "padded", "mixed"])
def test_pages_in_other_layouts_append_and_attend_in_place(layout):
    # page strides that are no multiple of the page's rows, or differ between K and V
    q, kc, vc, lens, table, k, v = cache_inputs(2, 2, 4, 2, 32, 80, [37, 5], page=16, new=3, seed=3)
    kc, vc = _paged_layout(kc, vc, layout)
    before = (q, kc.clone(), vc.clone(), lens, table, k, v)
    problem = make_kvcache_problem(q, kc, vc, lens, table, k, v, causal=True)
    out, lse = fa2gen.attention_with_kvcache(q, kc, vc, lens, block_table=table, k=k, v=v, causal=True, return_lse=True)
    check_cache_call(before, problem, out, lse, (kc, vc))


def test_the_reference_path_on_cpu_appends_like_the_kernels(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(api, "_warned_cpu", False)
    inputs = cache_inputs(2, 1, 2, 1, 16, 32, [5, 31], new=1, seed=2)
    q, kc, vc, lens, table, k, v = inputs
    before = (q, kc.clone(), vc.clone(), lens, table, k, v)
    with pytest.warns(RuntimeWarning, match="reference path"):
        out = fa2gen.attention_with_kvcache(q, kc, vc, lens, k=k, v=v)
    _, want_kc, want_vc = kvcache_reference(*before, make_kvcache_problem(*before))[1:]
    assert out.shape == q.shape and torch.equal(kc, want_kc) and torch.equal(vc, want_vc)


def _args(**change):
    q, kc, vc, lens, table, k, v = cache_inputs(2, 1, 4, 2, 16, 32, [3, 4], page=16, new=1)
    args = dict(q=q, k_cache=kc, v_cache=vc, cache_seqlens=lens, block_table=table, k=k, v=v)
    args.update(change)
    return args


@pytest.mark.parametrize(
    "change, error, match",
    [
        (dict(q=torch.zeros(2, 4, 16, dtype=torch.float16)), ValueError, "q must have 4 dims"),
        (dict(k_cache=torch.zeros(6, 16, 2, 16, dtype=torch.bfloat16)), TypeError, "k_cache has dtype"),
        (dict(v_cache=torch.zeros(6, 16, 1, 16, dtype=torch.float16)), ValueError, "v_cache must have the same shape"),
        (dict(cache_seqlens=torch.tensor([3, 4])), ValueError, "cache_seqlens must be an int32 tensor of shape"),
        (dict(cache_seqlens=torch.tensor([3], dtype=torch.int32)), ValueError, r"shape \(2,\)"),
        (dict(block_table=torch.zeros(2, 2, dtype=torch.int64)), ValueError, "block_table must be an int32"),
        (dict(block_table=torch.zeros(3, 2, dtype=torch.int32)), ValueError, "block_table must be a"),
        (
            dict(k_cache=torch.zeros(4, 24, 2, 16).half(), v_cache=torch.zeros(4, 24, 2, 16).half()),
            ValueError,
            "page size",
        ),
        (dict(v=None), ValueError, "k and v must be given together"),
        (dict(k=torch.zeros(2, 1, 1, 16, dtype=torch.float16)), ValueError, "k and v must be"),
        (dict(q=torch.zeros(2, 1, 3, 16, dtype=torch.float16)), ValueError, "multiple of the cache's k/v heads"),
        (dict(q=torch.zeros(2, 0, 4, 16, dtype=torch.float16)), ValueError, "at least one query token"),
    ],
)
def test_bad_arguments_are_refused_by_name(change, error, match):
    with pytest.raises(error, match=match):
        fa2gen.attention_with_kvcache(**_args(**change))


def test_the_contiguous_cache_must_hold_the_batch():
    args = _args(block_table=None)
    args["k_cache"], args["v_cache"] = (torch.zeros(3, 32, 2, 16, dtype=torch.float16) for _ in range(2))
    with pytest.raises(ValueError, match="k_cache holds 3 sequences but q has batch 2"):
        fa2gen.attention_with_kvcache(**args)


def test_a_cache_needing_gradients_is_refused():
    args = _args()
    args["q"] = args["q"].clone().requires_grad_()
    with pytest.raises(ValueError, match="forward only"):
        fa2gen.attention_with_kvcache(**args)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(cache_seqlens=torch.tensor([3, 32], dtype=torch.int32)), r"cache_seqlens must lie in \[0, 31\]"),
        (dict(cache_seqlens=torch.tensor([-1, 0], dtype=torch.int32)), "cache_seqlens must lie in"),
        (dict(block_table=torch.tensor([[0, 1], [2, 9]], dtype=torch.int32)), "block_table holds page 9"),
    ],
)
def test_validate_reads_the_lengths_and_the_table(change, match):
    with pytest.raises(ValueError, match=match):
        fa2gen.attention_with_kvcache(**_args(**change), validate=True)


@pytest.mark.parametrize(
    "batch, heads_kv, capacity, want",
    [
        (1, 8, 131072, 16),  # a lone sequence: enough splits for a program an SM
        (8, 8, 8192, 2),  # never past one wave
        (64, 8, 4096, 1),  # the batch fills the GPU alone
        (1, 8, 512, 4),  # short caches: at least 128 keys a split
        (1, 1, 1 << 20, 128),  # at most the combine's tile
    ],
)
def test_the_split_count_fills_the_gpu_without_tiny_splits(batch, heads_kv, capacity, want):
    q = torch.zeros(batch, 1, heads_kv * 4, 128, dtype=torch.float16, device="meta")
    kc = torch.zeros(batch, capacity, heads_kv, 128, dtype=torch.float16, device="meta")
    lens = torch.zeros(batch, dtype=torch.int32, device="meta")
    problem = make_kvcache_problem(q, kc, kc, lens)
    params = decode_default(problem.kernel_spec("decode"), "sm90", 4, batch * heads_kv)
    assert decode_splits(problem, params, 132) == want
    assert decode_splits(problem, params.replace(splits=16), 132) == 16  # a tuned count wins


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("page", [0, 16, 256], ids=["contiguous", "paged16", "paged256"])
@pytest.mark.parametrize("sq, new", [(1, 1), (4, 0), (16, 16)], ids=["decode", "four", "sixteen"])
@pytest.mark.parametrize("combine", ["kernel", "last"])
def test_the_decode_kernels_on_the_gpu_mixing_lengths_0_1_and_4k(dtype, page, sq, new, combine):
    lengths = [0, 1, 4096 - new, 1999]
    inputs = cache_inputs(4, sq, 8, 2, 128, 4096, lengths, page=page, new=new, dtype=dtype, device="cuda", seed=sq)
    options = {"causal": True} if sq > 1 else {}
    problem, out, lse, after, launch = run_cache(inputs, options, combine=combine)
    assert launch.splits > 1  # four sequences of 2 k/v heads leave most SMs to the splits
    check_cache_call(inputs, problem, out, lse, after)


@pytest.mark.gpu
def test_the_last_split_combines_under_graph_replay_and_leaves_its_counts_at_zero():
    """Splits combined by the one that finishes last count in a buffer they leave at zero: a
    graph captured once replays right on new cache contents, and so do eager calls after it."""
    from fa2gen.runtime.launch import zero_counters

    inputs = cache_inputs(2, 1, 32, 8, 128, 8192, [8191, 3000], new=1, dtype=torch.bfloat16, device="cuda", seed=3)
    q, kc, vc, lens, table, k, v = inputs
    problem = make_kvcache_problem(*inputs)
    params = decode_default(problem.kernel_spec("decode"), "sm90", 4, 16).replace(splits=16, combine="last")
    launch = CacheLaunch(problem, params, torch.cuda.get_device_properties(0).multi_processor_count)
    assert launch.combine_last
    out = torch.empty_like(q)
    lse = torch.empty(2, 32, 1, device="cuda")
    caches = kc.clone(), vc.clone()
    cache_forward(q, *caches, lens, table, k, v, problem, params, launch=launch, out=out, lse=lse)  # (compiles)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cache_forward(q, *caches, lens, table, k, v, problem, params, launch=launch, out=out, lse=lse)
    for seed in range(3):
        fresh = cache_inputs(
            2, 1, 32, 8, 128, 8192, [8191, 3000], new=1, dtype=torch.bfloat16, device="cuda", seed=seed
        )
        for static, new in zip((q, *caches, lens, table, k, v), fresh):
            if static is not None:
                static.copy_(new)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_cache_call(fresh, problem, out, lse, caches)
    out.fill_(float("nan"))
    caches = kc.clone(), vc.clone()
    cache_forward(q, *caches, lens, table, k, v, problem, params, launch=launch, out=out, lse=lse)
    torch.cuda.synchronize()
    check_cache_call((q, kc, vc, lens, table, k, v), problem, out, lse, caches)
    assert not zero_counters(q.device, 1).any()


@pytest.mark.gpu
@pytest.mark.parametrize("options", [{"window_size": (300, 0)}, {"softcap": 30.0}], ids=str)
def test_a_long_paged_cache_on_the_gpu_with_a_window_or_softcap(options):
    inputs = cache_inputs(1, 2, 32, 8, 128, 32768, [30000], page=64, new=2, dtype=torch.bfloat16, device="cuda")
    problem, out, lse, after, _ = run_cache(inputs, options)
    check_cache_call(inputs, problem, out, lse, after)


def test_a_paged_cache_splits_twice_as_often_and_steps_128_keys():
    q = torch.zeros(1, 1, 32, 128, dtype=torch.bfloat16, device="meta")
    pages = torch.zeros(8192, 16, 8, 128, dtype=torch.bfloat16, device="meta")
    table = torch.zeros(1, 8192, dtype=torch.int32, device="meta")
    lens = torch.zeros(1, dtype=torch.int32, device="meta")
    problem = make_kvcache_problem(q, pages, pages, lens, table)
    assert problem.page_size == 16 and problem.seqlen_k == 131072
    params = decode_default(problem.kernel_spec("decode"), "sm90", 4, 8)
    assert (params.block_n, params.num_stages) == (128, 2)
    assert decode_splits(problem, params, 132) == 33


@pytest.mark.gpu
def test_repeated_calls_keep_one_launch_and_read_each_calls_lengths():
    from fa2gen.runtime import dispatch

    dispatch.clear_memo()
    for step, lengths in enumerate(([100, 5000], [0, 7001], [4095, 1])):
        inputs = cache_inputs(2, 1, 16, 4, 64, 8192, lengths, page=32, new=1, device="cuda", seed=step)
        q, kc, vc, lens, table, k, v = inputs
        before = (q, kc.clone(), vc.clone(), lens, table, k, v)
        out, lse = fa2gen.attention_with_kvcache(q, kc, vc, lens, block_table=table, k=k, v=v, return_lse=True)
        check_cache_call(before, make_kvcache_problem(*before), out, lse, (kc, vc))
    assert len(dispatch._launches) == 1


def test_the_cache_check_fails_wrong_outputs_and_caches():
    inputs = cache_inputs(2, 2, 4, 2, 16, 32, [5, 20], page=16, new=2, seed=4)
    problem = make_kvcache_problem(*inputs, causal=True)
    out, lse, k_after, v_after = kvcache_reference(*inputs, problem)
    assert check_cache(inputs, problem, out, lse, (k_after, v_after)).ok
    assert not check_cache(inputs, problem, out + 0.05, lse, (k_after, v_after)).ok
    assert not check_cache(inputs, problem, out, lse + 0.01, (k_after, v_after)).ok
    assert not check_cache(inputs, problem, out, lse, (inputs[1], v_after)).ok  # nothing appended
    assert not check_cache(inputs, problem, out.masked_fill(out == out.max(), float("nan")), lse).ok


def test_the_decode_space_is_the_triton_templates_pointer_loads():
    from fa2gen.generator.spec import KernelSpec, param_space, unsupported

    spec = KernelSpec(direction="decode", dtype="bf16", head_dim=128, paged=True)
    points = param_space(spec)
    assert points and {(p.gluon, p.loads, p.persistent, p.dq_mode) for p in points} == {(0, "pointer", 0, "separate")}
    assert {p.splits for p in points} == {0, 1, 2, 4, 8, 16, 32, 64, 128}
    assert {p.combine for p in points} == {"auto", "kernel", "last"}
    assert decode_combine(points[0].replace(combine="auto"), 2) == "last"
    assert decode_combine(points[0].replace(combine="auto"), 4) == "kernel"
    assert decode_combine(points[0].replace(combine="kernel"), 2) == "kernel"
    assert unsupported(spec, points[0].replace(gluon=1)) == "no decode template renders gluon=1"


@pytest.mark.parametrize(
    "batch, sq, group, keys, served",
    [
        (2, 1, 4, 8192, True),
        (2, 1, 4, 8191, False),
        (2, 16, 8, 32768, True),
        (2, 16, 8, 32767, False),  # 4 tiles: few tokens wait for 32k keys
        (2, 4, 4, 8192, False),
        (2, 17, 1, 65536, False),
        (32, 1, 4, 512, True),  # 64 tiles of k/v heads: from 512 keys
        (32, 16, 4, 512, True),
        (32, 4, 4, 511, False),
        (31, 1, 4, 4096, False),  # 62 tiles
        (32, 1, 1, 4096, False),  # no GQA: the dense forward reads each K/V block once already
        (32, 1, 1, 8192, True),
    ],
)
def test_which_attention_calls_the_decode_kernels_serve(batch, sq, group, keys, served):
    from fa2gen.runtime.kvcache import serves_as_cache

    q = torch.zeros(batch, 2 * group, sq, 64, dtype=torch.bfloat16, device="meta")
    k = torch.zeros(batch, 2, keys, 64, dtype=torch.bfloat16, device="meta")
    assert serves_as_cache(make_problem(q, k, k, causal=True)) is served


@pytest.mark.interpreter
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
@pytest.mark.parametrize("options", [{}, {"causal": True}, {"window_size": (30, 2), "softcap": 4.0}], ids=str)
def test_dense_inputs_through_the_decode_kernels(options, layout):
    from fa2gen.runtime.kvcache import attention_as_cache
    from fa2gen.runtime.problem import cache_problem

    # (B, H, N, D) as attention() takes them, contiguous or strided as a cache's transposed view
    q, k, v = rand_qkv(2, 6, 2, 3, 150, 40, seed=9, layout=layout)
    problem = cache_problem(make_problem(q, k, v, **options))
    params = decode_default(problem.kernel_spec("decode"), "cpu", 9, 4).replace(splits=4)
    out, lse = attention_as_cache(q, k, v, CacheLaunch(problem, params, 3, heads_major=True))
    assert out.shape == q.shape and lse.shape == (2, 6, 3)
    verdict = check_forward(q, k, v, make_problem(q, k, v, **options), out, lse)
    assert verdict.ok, str(verdict)


def test_a_heads_major_cache_launch_takes_only_a_full_contiguous_cache():
    from fa2gen.runtime.problem import cache_problem

    q, k, v = rand_qkv(1, 4, 2, 1, 64, 32)
    problem = make_problem(q, k, v)
    params = decode_default(cache_problem(problem).kernel_spec("decode"), "cpu", 9, 4)
    for paged in (cache_problem(problem, page_size=16), cache_problem(problem, new_keys=1)):
        with pytest.raises(ValueError, match="heads-major"):
            CacheLaunch(paged, params, 3, heads_major=True)


@pytest.mark.gpu
def test_attention_without_a_gradient_decodes_through_the_decode_kernels():
    from fa2gen.runtime import dispatch

    dispatch.clear_memo()
    q, k, v = rand_qkv(2, 32, 8, 1, 9000, 128, dtype=torch.bfloat16, device="cuda", seed=4)
    out, lse = fa2gen.attention(q, k, v, causal=True, return_lse=True)
    assert any(key[0] == "as-cache" for key in dispatch._launches)
    verdict = check_forward(q, k, v, make_problem(q, k, v, causal=True), out, lse)
    assert verdict.ok, str(verdict)
    [kept] = [launch for key, launch in dispatch._launches.items() if key[0] == "as-cache"]
    q.requires_grad_()
    fa2gen.attention(q, k, v, causal=True).sum().backward()  # a gradient: the dense kernels
    assert q.grad is not None and not q.grad.isnan().any()
    with torch.no_grad():  # the shape's dense launch is kept now; the decode one is still found
        fa2gen.attention(q, k, v, causal=True)
    assert [launch for key, launch in dispatch._launches.items() if key[0] == "as-cache"] == [kept]
