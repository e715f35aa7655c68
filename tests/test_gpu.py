"""GPU checks at real sizes (marker ``gpu``; skipped without CUDA)."""

import json
import subprocess
import sys

import pytest
import torch
from helpers import rand_fp8, rand_qkv, run_and_check

import fa2gen
from fa2gen.bench.correctness import check_backward, check_forward
from fa2gen.generator.cache import load_module
from fa2gen.generator.spec import TuningParams
from fa2gen.runtime.device import cuda_device_info
from fa2gen.runtime.dispatch import clear_memo, select_params
from fa2gen.runtime.fp8 import check_descales
from fa2gen.runtime.launch import forward
from fa2gen.runtime.problem import make_problem

pytestmark = pytest.mark.gpu
DTYPES = [torch.float16, torch.bfloat16]
# (B, Hq, Hkv, Nq, Nk, D) and attention() options: GQA/MQA both ways, windows, softcap,
# decoding, a padded head dim with everything on
FEATURE_CASES = [
    ((2, 8, 2, 1000, 3001, 128), {"causal": True}),
    ((2, 8, 1, 3001, 1000, 64), {"causal": True}),
    ((1, 6, 3, 2500, 2500, 96), {"window_size": (256, 17)}),
    ((1, 4, 4, 1777, 1777, 128), {"softcap": 30.0}),
    ((3, 4, 2, 1, 4099, 128), {}),
    ((1, 4, 4, 513, 513, 160), {"causal": True, "window_size": (100, -1), "softcap": 10.0}),
]
FEATURE_IDS = ["gqa-causal-nk>nq", "mqa-causal-nq>nk", "window", "softcap", "decode", "d160-all"]


def _attention_checked(q, k, v, **kw):
    problem = make_problem(q, k, v, **kw)
    out, lse = fa2gen.attention(q, k, v, return_lse=True, **kw)
    return check_forward(q, k, v, problem, out, lse)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("D", [64, 80, 128, 192, 256])
@pytest.mark.parametrize("kw", [{}, {"causal": True}], ids=["full", "causal"])
def test_default_dispatch_real_sizes(dtype, D, kw):
    q, k, v = rand_qkv(2, 4, 4, 2048 + 77, 2048 + 77, D, dtype=dtype, device="cuda", seed=D)
    verdict = _attention_checked(q, k, v, **kw)
    assert verdict.ok, str(verdict)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("D", [64, 128, 256])
def test_long_sequence_16k(dtype, D):
    q, k, v = rand_qkv(1, 2, 2, 16384, 16384, D, dtype=dtype, device="cuda", seed=1)
    verdict = _attention_checked(q, k, v, causal=True)
    assert verdict.ok, str(verdict)


@pytest.mark.parametrize("loads", ["pointer", "tma_device", "tma_host"])
@pytest.mark.parametrize("shape,kw", FEATURE_CASES, ids=FEATURE_IDS)
def test_features_on_both_load_paths(loads, shape, kw):
    q, k, v = rand_qkv(*shape, device="cuda", seed=sum(shape))
    params = TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=2, loads=loads)
    verdict, _, _ = run_and_check(q, k, v, params, **kw)
    assert verdict.ok, str(verdict)


def test_strided_layout_and_output_layout():
    q, k, v = rand_qkv(2, 8, 8, 1500, 1500, 128, device="cuda", layout="bnhd", seed=4)
    verdict = _attention_checked(q, k, v, causal=True)
    assert verdict.ok, str(verdict)
    assert fa2gen.attention(q, k, v).stride() == q.stride()


def test_new_sequence_length_does_not_recompile():
    q, k, v = rand_qkv(1, 4, 4, 1000, 1000, 64, device="cuda")
    fa2gen.attention(q, k, v, causal=True)
    problem = make_problem(q, k, v, causal=True)
    params = select_params(problem, cuda_device_info(torch.cuda.current_device()))
    kernel = load_module(problem.kernel_spec(), params).attn_fwd
    dev = torch.cuda.current_device()
    compiled = len(kernel.device_caches[dev][0])
    for n in (1001, 1777, 4096, 999):
        q, k, v = rand_qkv(1, 4, 4, n, n + 3, 64, device="cuda", seed=n)
        fa2gen.attention(q, k, v, causal=True)
    assert len(kernel.device_caches[dev][0]) == compiled


def test_bench_cli_on_gpu(tmp_path):
    out = tmp_path / "b.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "fa2gen",
            "bench",
            "--shapes",
            "2,16,2048,128",
            "--dtypes",
            "fp16",
            "--causal",
            "both",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(out.read_text())
    from fa2gen.bench.timing import TIMING

    assert data["environment"]["timing"] == TIMING
    for row in data["results"]:
        assert {"fa2gen", "sdpa-cudnn", "sdpa-flash", "flex"} <= set(row["tflops"]), row["skipped"]
        assert row["max_diff_vs_fa2gen"]["sdpa-flash"] < 2e-2
        for name, (p20, median, p80) in row["ms"].items():
            assert 0 < p20 <= median <= p80, (name, row["ms"][name])


def _tune_on_gpu(tmp_path, bucket, trials: int, batch: int):
    """A short real tuning run of one bucket on this GPU: (its result, the entries stored)."""
    import triton

    from fa2gen.store.db import TunedDB
    from fa2gen.store.records import Validity
    from fa2gen.tuner.evaluate import GpuEvaluator
    from fa2gen.tuner.run import TuneOptions, open_storage, tune
    from fa2gen.tuner.space import space_for

    dev = cuda_device_info(torch.cuda.current_device())
    db = TunedDB(tmp_path / "t.sqlite")
    ev = GpuEvaluator(workers=4)
    try:
        [r] = tune(
            [bucket],
            ev,
            space_for(dev.arch),
            db=db,
            storage=open_storage(f"sqlite:///{tmp_path / 's.sqlite'}"),
            validity_for=lambda b: Validity(dev.name, f"{dev.capability[0]}.{dev.capability[1]}", triton.__version__),
            options=TuneOptions(trials=trials, batch=batch),
        )
    finally:
        ev.close()
    return r, list(db.entries(bucket=bucket.key))


def test_tune_on_gpu_stores_a_correct_winner(tmp_path):
    """A short real tuning run: parallel compile, correctness gate, timing, storage."""
    from fa2gen.store.buckets import Bucket

    r, [stored] = _tune_on_gpu(tmp_path, Bucket("fwd", "fp16", 128, "causal", False, 1, 2048, 2048, 64), 8, 4)
    assert r.best is not None and r.default_ms is not None
    assert r.measurement.tflops > 50 and r.measurement.max_error < 1e-2
    assert stored.params == r.best


def test_tune_a_paged_decode_bucket_on_gpu(tmp_path):
    """A short real tuning run of a KV cache bucket: compiles in workers, the cache gate
    (lengths 0 and odd, keys appended through shuffled pages), timing, storage."""
    from fa2gen.store.buckets import Bucket

    r, [stored] = _tune_on_gpu(tmp_path, Bucket("decode", "bf16", 128, "causal", False, 4, 4, 8192, 64, 16), 6, 3)
    assert r.best is not None and r.default_ms is not None and r.measurement.max_error < 1e-2
    assert stored.params == r.best


def _grad_check(shape, dtype=torch.float16, layout="bhnd", dout_transposed=False, **kw):
    from fa2gen.bench.correctness import check_backward

    q, k, v = rand_qkv(*shape, dtype=dtype, device="cuda", layout=layout, seed=sum(shape))
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fa2gen.attention(q, k, v, **kw)
    B, Hq, Nq, D = q.shape
    g = torch.Generator(device="cuda").manual_seed(1)
    if dout_transposed:  # a grad_output whose last dim is not contiguous
        dout = torch.randn(B, Hq, D, Nq, device="cuda", generator=g).to(dtype).transpose(-1, -2)
    else:
        dout = torch.randn(B, Hq, Nq, D, device="cuda", generator=g).to(dtype)
    out.backward(dout)
    problem = make_problem(q, k, v, **kw)
    return check_backward(q.detach(), k.detach(), v.detach(), problem, dout, q.grad, k.grad, v.grad)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("D", [64, 80, 128, 256])
@pytest.mark.parametrize("kw", [{}, {"causal": True}], ids=["full", "causal"])
def test_backward_real_sizes(dtype, D, kw):
    verdict = _grad_check((2, 4, 2, 1500 + 37, 1500 + 37, D), dtype=dtype, **kw)
    assert verdict.ok, str(verdict)


@pytest.mark.parametrize("shape,kw", FEATURE_CASES, ids=FEATURE_IDS)
def test_backward_features(shape, kw):
    verdict = _grad_check(shape, layout="bnhd", dout_transposed=True, **kw)
    assert verdict.ok, str(verdict)


def test_attention_keeps_each_call_shapes_backward_launch():
    """The second backward of a call shape reuses the first one's launch (host time bounds
    short cells), on new tensors of that shape, with the right gradients."""
    from fa2gen.runtime.api import _call_key
    from fa2gen.runtime.dispatch import cached_launch

    clear_memo()
    kept = []
    for seed in (21, 22):
        q, k, v = (t.detach().requires_grad_() for t in rand_qkv(2, 8, 2, 1000, 1000, 128, device="cuda", seed=seed))
        out = fa2gen.attention(q, k, v, causal=True)
        dout = torch.randn_like(out)
        out.backward(dout)
        launch = cached_launch(_call_key(q, k, v, True, None, (-1, -1), 0.0, (None,) * 4, 0.0))
        assert list(launch.backward) == [False]
        kept.append(launch.backward[False])
        problem = make_problem(q, k, v, causal=True)
        verdict = check_backward(q.detach(), k.detach(), v.detach(), problem, dout, q.grad, k.grad, v.grad)
        assert verdict.ok, str(verdict)
    assert kept[0] is kept[1]


def direct_launches_taken(monkeypatch) -> list:
    """Records, for each launch offered to a kept launcher, whether it was taken (True) or
    left to Triton (False)."""
    from fa2gen.runtime import direct

    taken = []
    real = direct.DirectKernel.__call__

    def counted(self, args):
        taken.append(real(self, args))
        return taken[-1]

    monkeypatch.setattr(direct.DirectKernel, "__call__", counted)
    return taken


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_direct_launches_give_the_bits_of_triton_launches(monkeypatch, causal):
    """FA2GEN_DIRECT_LAUNCH=1: a call shape's later calls launch through the kept launchers,
    with outputs and gradients bitwise those of launches through Triton; a call that
    specialises otherwise (an output gradient with other strides) goes through Triton."""
    from fa2gen.runtime import direct

    taken = direct_launches_taken(monkeypatch)
    q, k, v = rand_qkv(2, 8, 2, 777, 777, 128, device="cuda", seed=31)
    dout = torch.randn(q.shape, device="cuda", dtype=q.dtype)
    other = dout.transpose(1, 2).contiguous().transpose(1, 2)  # same values, other strides

    def calls(enabled):
        monkeypatch.setattr(direct, "ENABLED", enabled)
        clear_memo()
        results = []
        for g in (dout, dout, dout, other):
            leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]  # new memory each call
            out = fa2gen.attention(*leaves, causal=causal, deterministic=True)
            out.backward(g)
            results.append([out.detach()] + [t.grad for t in leaves])
        return results

    through_triton, direct_ones = calls(False), calls(True)
    clear_memo()
    for a, b in zip(through_triton, direct_ones):
        for x, y in zip(a, b):
            assert torch.equal(x, y)
    # Call 1 launches through Triton and keeps the launchers (forward; delta, dK/dV, dQ).
    # Calls 2 and 3 take them all. Call 4: the forward does; the delta and dQ kernels, whose
    # arguments hold dout's strides, go through Triton.
    assert len(taken) == 3 * 4 and all(taken[:9]) and not taken[9] and not taken[11]


def test_fp8_calls_launch_v_copy_and_attention_directly(monkeypatch):
    """An fp8 call shape's later calls launch V's staged copy and the attention kernel through
    the kept launchers, past Triton's per-call dispatch, with the bits of launches through
    Triton."""
    from fa2gen.runtime import direct

    taken = direct_launches_taken(monkeypatch)
    q, k, v = (
        t.to(torch.float8_e4m3fn) for t in rand_qkv(2, 4, 2, 333, 517, 128, device="cuda", seed=7, dtype=torch.float32)
    )

    def calls(enabled):
        monkeypatch.setattr(direct, "ENABLED", enabled)
        clear_memo()
        return [fa2gen.attention(q, k, v.clone(), causal=True) for _ in range(3)]

    through_triton, direct_ones = calls(False), calls(True)
    clear_memo()
    assert all(torch.equal(a, b) for a, b in zip(through_triton, direct_ones))
    # the first call keeps both launchers; the next two take them: copy, then attention
    assert taken == [True] * 4


@pytest.fixture(params=["atomic", "tma_reduce"])
def atomic_dq(monkeypatch, request):
    """attention()'s backward with dQ added from the dK/dV kernel: by per-element atomics,
    or by bulk reductions through host descriptors. On the arch default tile, not the
    dispatched one: shipped sm90 configs are tuned with dQ in its own kernel, and a tile
    that fits there can overflow shared memory once the dK/dV kernel also carries dQ."""
    import fa2gen.runtime.autograd as autograd
    from fa2gen.runtime.defaults import default_params

    extra = {"loads": "tma_host"} if request.param == "tma_reduce" else {}

    def params(problem, dev, direction):
        base = default_params(problem.kernel_spec(direction), dev.arch, problem.seqlen_q)
        return base.replace(dq_mode=request.param, **extra) if direction == "bwd" else base

    monkeypatch.setattr(autograd, "select_params", params)
    clear_memo()  # attention() keeps each call shape's backward launch: none chosen before this
    yield
    clear_memo()


@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("kw", [{}, {"causal": True}], ids=["full", "causal"])
def test_backward_atomic_dq_real_sizes(atomic_dq, D, kw):
    verdict = _grad_check((2, 4, 2, 1500 + 37, 1500 + 37, D), dtype=torch.bfloat16, **kw)
    assert verdict.ok, str(verdict)


@pytest.mark.parametrize("shape,kw", FEATURE_CASES, ids=FEATURE_IDS)
def test_backward_atomic_dq_features(atomic_dq, shape, kw):
    verdict = _grad_check(shape, layout="bnhd", dout_transposed=True, **kw)
    assert verdict.ok, str(verdict)


def _assert_deterministic_gradients(seed, head_dim=128, causal=True):
    q, k, v = rand_qkv(2, 8, 2, 2000, 2000, head_dim, device="cuda", seed=seed)
    grads = []
    for _ in range(2):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        fa2gen.attention(*leaves, causal=causal, deterministic=True).sum().backward()
        grads.append([t.grad for t in leaves])
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_deterministic_overrides_atomic_dq(atomic_dq):
    _assert_deterministic_gradients(seed=6)


def test_backward_long_sequence():
    verdict = _grad_check((1, 2, 2, 8192, 8192, 128), causal=True)
    assert verdict.ok, str(verdict)


def test_backward_against_fp64_reference():
    """Small case against autograd through the reference in float64: each gradient within
    twice the error PyTorch makes computing the same thing in fp16 (plus atol)."""
    from fa2gen.runtime.reference import attention_reference

    q, k, v = rand_qkv(1, 4, 2, 67, 91, 64, device="cuda", seed=3)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = fa2gen.attention(*leaves, causal=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    problem = make_problem(q, k, v, causal=True)

    def grads(dtype, compute):
        xs = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        o, _ = attention_reference(*xs, problem, compute_dtype=compute)
        o.backward(dout.to(o.dtype))
        return [x.grad.double() for x in xs]

    exact = grads(torch.float64, torch.float64)
    fp16 = grads(torch.float16, torch.float16)
    for mine, ref, base in zip((t.grad for t in leaves), exact, fp16):
        err = (mine.double() - ref).abs().max().item()
        assert err <= 2 * (base - ref).abs().max().item() + 1e-4, err


def test_backward_is_deterministic_on_gpu():
    _assert_deterministic_gradients(seed=5)


def test_backward_is_deterministic_where_the_one_pass_is_shipped():
    # D=64 without a mask from N=1k: the H200's configs run the one pass (dQ added in no fixed
    # order, by the TMA's bulk reductions)
    _assert_deterministic_gradients(seed=7, head_dim=64, causal=False)


# ---------------------------------------------------------------------------------------------
# fp8 (e4m3) forward


def _fp8_checked(shape, params=None, seed=0, **kw):
    (q, k, v), scales = rand_fp8(*shape, device="cuda", seed=seed)
    problem = make_problem(q, k, v, **kw)
    descales = check_descales(problem, q.device, *scales)
    if params is None:  # attention() as users call it
        out, lse = fa2gen.attention(
            q, k, v, return_lse=True, descale_q=scales[0], descale_k=scales[1], descale_v=scales[2], **kw
        )
    else:  # one variant, on NaN-poisoned outputs
        out = torch.full(q.shape, float("nan"), device="cuda", dtype=torch.bfloat16)
        lse = torch.full((problem.batch, problem.heads_q, problem.seqlen_q), float("nan"), device="cuda")
        forward(q, k, v, problem, params, out=out, lse=lse, descales=descales)
    assert out.dtype == torch.bfloat16
    return check_forward(q, k, v, problem, out, lse, descales=descales)


@pytest.mark.parametrize("D", [64, 80, 128, 256])
@pytest.mark.parametrize("kw", [{}, {"causal": True}], ids=["full", "causal"])
def test_fp8_default_dispatch_real_sizes(D, kw):
    verdict = _fp8_checked((2, 4, 4, 2048 + 77, 2048 + 77, D), seed=D, **kw)
    assert verdict.ok, str(verdict)


@pytest.mark.parametrize("loads", ["pointer", "tma_device", "tma_host"])
@pytest.mark.parametrize("shape,kw", FEATURE_CASES, ids=FEATURE_IDS)
def test_fp8_features_on_every_load_path(loads, shape, kw):
    params = TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=2, loads=loads)
    verdict = _fp8_checked(shape, params, seed=sum(shape), **kw)
    assert verdict.ok, str(verdict)


@pytest.mark.parametrize("tile", [(128, 64, 4, 2), (128, 128, 8, 3), (128, 256, 8, 2)], ids=str)
def test_fp8_large_tiles(tile):
    params = TuningParams(*tile, loads="tma_host")
    verdict = _fp8_checked((1, 8, 2, 4096 + 33, 4096 + 33, 128), params, causal=True)
    assert verdict.ok, str(verdict)


def test_fp8_long_sequence_16k():
    verdict = _fp8_checked((1, 2, 2, 16384, 16384, 128), causal=True)
    assert verdict.ok, str(verdict)


@pytest.mark.parametrize("persistent", [1, 2])
@pytest.mark.parametrize("loads", ["pointer", "tma_device", "tma_host"])
@pytest.mark.parametrize("shape,kw", FEATURE_CASES[:3], ids=FEATURE_IDS[:3])
def test_persistent_grids(persistent, loads, shape, kw):
    q, k, v = rand_qkv(*shape, device="cuda", seed=sum(shape))
    params = TuningParams(block_m=128, block_n=64, num_warps=4, num_stages=2, loads=loads, persistent=persistent)
    verdict, _, _ = run_and_check(q, k, v, params, **kw)
    assert verdict.ok, str(verdict)


def test_fp8_repeated_calls_check_each_call_s_factors():
    """attention() keeps one launch per call shape; the factors are data, checked and used
    afresh on every call (per tensor, then per head, on the same tensors)."""
    (q, k, v), scales = rand_fp8(2, 4, 2, 1000, 1000, 128, device="cuda", seed=5)
    problem = make_problem(q, k, v)
    for factors in ([s.amax().reshape(()) for s in scales], scales):
        out, lse = fa2gen.attention(
            q, k, v, return_lse=True, descale_q=factors[0], descale_k=factors[1], descale_v=factors[2]
        )
        verdict = check_forward(q, k, v, problem, out, lse, descales=check_descales(problem, q.device, *factors))
        assert verdict.ok, str(verdict)
    with pytest.raises(ValueError, match="descale_v"):
        fa2gen.attention(q, k, v, descale_v=torch.ones(3, device="cuda"))


@pytest.mark.parametrize("persistent", [1, 2])
@pytest.mark.parametrize("loads", ["pointer", "tma_host"])
@pytest.mark.parametrize("shape,kw", FEATURE_CASES[:3], ids=FEATURE_IDS[:3])
def test_fp8_persistent_grids(persistent, loads, shape, kw):
    params = TuningParams(block_m=128, block_n=64, num_warps=4, num_stages=3, loads=loads, persistent=persistent)
    verdict = _fp8_checked(shape, params, seed=sum(shape), **kw)
    assert verdict.ok, str(verdict)


def test_fp8_transpose_of_many_heads():
    """More (batch, head) pairs than a grid's second axis holds (65535)."""
    from fa2gen.runtime.fp8 import transposed_v

    v = torch.randn(1024, 70, 40, 32, device="cuda").to(torch.float8_e4m3fn)
    vt = transposed_v(v)
    assert torch.equal(vt.view(torch.uint8), v.transpose(-1, -2).view(torch.uint8))


def test_tune_a_packed_backward_bucket_on_gpu(tmp_path):
    """A short real tuning run of a packed-batch bucket: compiles in workers, the gate on a
    batch mixing lengths 0, 1 and odd ones (forward and gradients), timing, storage."""
    from fa2gen.store.buckets import Bucket

    bucket = Bucket("bwd", "bf16", 128, "causal", False, 1, 2048, 2048, 128, varlen=True)
    r, [stored] = _tune_on_gpu(tmp_path, bucket, 6, 3)
    assert r.best is not None and r.default_ms is not None and r.measurement.max_error < 1e-2
    assert stored.params == r.best
