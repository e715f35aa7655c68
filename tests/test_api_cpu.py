import warnings

import pytest
import torch
from helpers import rand_qkv

import fa2gen
from fa2gen.generator.arch import fits
from fa2gen.generator.spec import HEAD_DIMS, KernelSpec, TuningParams
from fa2gen.runtime import api, lookup
from fa2gen.runtime.defaults import default_params
from fa2gen.runtime.device import DeviceInfo
from fa2gen.runtime.dispatch import clear_memo, select_params
from fa2gen.runtime.launch import effective_params, tma_compatible
from fa2gen.runtime.problem import make_problem
from fa2gen.runtime.reference import attention_reference
from fa2gen.runtime.varlen import batch_view


@pytest.mark.interpreter
def test_attention_interpreter_path_and_lse():
    q, k, v = rand_qkv(2, 4, 2, 33, 47, 64, seed=1)
    out = fa2gen.attention(q, k, v, causal=True)
    out2, lse = fa2gen.attention(q, k, v, causal=True, return_lse=True)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (2, 4, 33) and lse.dtype == torch.float32
    assert torch.equal(out, out2)
    ref, ref_lse = attention_reference(q, k, v, make_problem(q, k, v, causal=True))
    assert (out.float() - ref.float()).abs().max() < 4e-3
    assert (lse - ref_lse).abs().max() < 1e-4


def test_reference_path_warns_once(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(api, "_warned_cpu", False)
    q, k, v = rand_qkv(1, 2, 2, 9, 9, 32)
    with pytest.warns(RuntimeWarning, match="reference path"):
        out = fa2gen.attention(q, k, v)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fa2gen.attention(q, k, v)
    ref, _ = attention_reference(q, k, v, make_problem(q, k, v))
    assert torch.equal(out, ref)


def test_batch_zero_returns_empty():
    q, k, v = rand_qkv(0, 2, 2, 9, 9, 32)
    out, lse = fa2gen.attention(q, k, v, return_lse=True)
    assert out.shape == q.shape and lse.shape == (0, 2, 9)


def test_tma_falls_back_on_misaligned_tensors():
    q, k, v = rand_qkv(1, 2, 2, 16, 16, 64)
    assert tma_compatible(q, k, v)
    flat = torch.randn(8 + 2 * 16 * 64).half()
    shifted = flat[1:2049].view(1, 2, 16, 64)  # 2-byte offset base
    assert not tma_compatible(shifted)
    # strides seen before with an aligned base: the base is still checked on every call
    again = flat[8:].view(1, 2, 16, 64)
    assert tma_compatible(again) and not tma_compatible(flat[1:2049].view(1, 2, 16, 64))
    assert not tma_compatible(torch.randn(1, 2, 16, 60).half())  # rows of 120 bytes: no multiple of 16
    assert not tma_compatible(q.transpose(-1, -2))  # columns not contiguous
    # a packed batch's views (batch stride 0): only in-kernel descriptors, which step over it
    packed = batch_view(q[0].transpose(0, 1).contiguous(), 3)
    assert packed.stride()[:2] == (0, 64)
    assert tma_compatible(packed, in_kernel=True) and not tma_compatible(packed)
    spec = KernelSpec(head_dim=64)
    for loads in ("tma_device", "tma_host"):
        p = TuningParams(loads=loads)
        assert effective_params(spec, p, q, shifted).loads == "pointer"
        assert effective_params(spec, p, q, k) is p
    # D=256, 64x64, 3 stages: fits with descriptors, not with pointers (P is staged too)
    big, tight = KernelSpec(head_dim=256), TuningParams(64, 64, 4, 3, "tma_host")
    assert fits(big, tight, "sm90") is None and fits(big, tight.replace(loads="pointer"), "sm90") is not None
    swapped = effective_params(big, tight, shifted)
    assert swapped.loads == "pointer" and fits(big, swapped, "sm90") is None
    # dQ's bulk reduction needs a descriptor too: on misaligned tensors, per-element atomics
    bwd, reduce = KernelSpec(direction="bwd", head_dim=64), TuningParams(64, 32, 4, 2, "tma_host", "tma_reduce")
    assert effective_params(bwd, reduce, shifted) == reduce.replace(loads="pointer", dq_mode="atomic")
    assert effective_params(bwd, reduce, q, k) is reduce


def test_defaults_fit_every_arch_and_head_dim():
    for arch in ("sm80", "sm86", "sm89", "sm90"):
        for d in HEAD_DIMS:
            for n in (1, 7, 64, 4096):
                spec = KernelSpec(head_dim=d, mask="causal")
                params = default_params(spec, arch, n)
                assert fits(spec, params, arch) is None, (arch, d, params)
                assert params.block_m <= max(16, 1 << (n - 1).bit_length())
            bwd = KernelSpec(direction="bwd", head_dim=d)
            params = default_params(bwd, arch, 4096)
            assert fits(bwd, params, arch) is None, (arch, d, params)
            if arch != "sm90":  # host descriptors need Hopper's tensor memory accelerator
                assert params.loads == "pointer"
    assert default_params(KernelSpec(head_dim=128), "sm86", 4096).loads == "pointer"


def test_sm90_short_causal_defaults_use_short_query_tiles():
    # Measured on the H200 (the notebook v6): causal cells up to 1k (D=64) and
    # 2k (D=128) tokens run faster with 64-row tiles; longer and unmasked ones do not.
    for d, longest in ((64, 1024), (128, 2048)):
        causal, full = KernelSpec(head_dim=d, mask="causal"), KernelSpec(head_dim=d)
        assert default_params(causal, "sm90", longest).block_m == 64
        assert default_params(causal, "sm90", 2 * longest) == default_params(full, "sm90", 2 * longest)
    assert default_params(KernelSpec(head_dim=64, mask="causal"), "sm90", 2048).block_n == 128
    assert default_params(KernelSpec(head_dim=128), "sm90", 512).block_m == 128


def test_sm90_backward_defaults_follow_the_tuned_winners():
    # The H200 backward tuning runs (the notebook v11)
    bwd = lambda d, mask="none": KernelSpec(direction="bwd", head_dim=d, mask=mask)  # noqa: E731
    assert default_params(bwd(128, "causal"), "sm90", 1024).label() == "m64 n16 w4 s3 tma_host"
    assert default_params(bwd(128, "causal"), "sm90", 2048).label() == "m128 n32 w8 s3 pointer"
    assert default_params(bwd(128), "sm90", 512).label() == "m128 n32 w8 s3 pointer"
    assert default_params(bwd(64, "causal"), "sm90", 512).label() == "m128 n32 w4 s3 pointer"
    assert default_params(bwd(64), "sm90", 512).label() == "m128 n32 w4 s4 tma_host"
    assert default_params(bwd(256, "causal"), "sm90", 512).label() == "m16 n32 w4 s2 tma_host"
    assert default_params(bwd(128, "causal"), "sm80", 512).loads == "pointer"


H200 = DeviceInfo(name="NVIDIA_H200", capability=(9, 0), arch="sm90", sm_count=132)


def test_dispatch_memoises_per_bucket(monkeypatch):
    from fa2gen.runtime import dispatch

    clear_memo()
    calls = []
    monkeypatch.setattr(dispatch, "choose", lambda p, d, direction: calls.append(p) or lookup.choose(p, d, direction))
    q, k, v = rand_qkv(1, 2, 2, 300, 300, 64)
    p1 = select_params(make_problem(q, k, v), H200)
    q2, k2, v2 = rand_qkv(1, 2, 2, 400, 500, 64)  # same bucket: q512 k512
    assert select_params(make_problem(q2, k2, v2), H200) is p1
    assert len(calls) == 1
    q3, k3, v3 = rand_qkv(1, 2, 2, 3, 3, 64)
    assert select_params(make_problem(q3, k3, v3), H200).block_m == 16
    assert len(calls) == 2
