"""Attention implementations compared side by side: fa2gen and its reference points."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from .grid import Case


@dataclass(frozen=True)
class Provider:
    name: str
    build: Callable  # (case, q, k, v) -> zero-argument callable running the forward
    cuda_only: bool = True
    # fp8 cases: whether it takes the fp8 tensors; the others run on the same values in bf16
    takes_fp8: bool = False
    fp8_only: bool = False

    def unavailable(self, case: Case, device: torch.device) -> str | None:
        if self.cuda_only and device.type != "cuda":
            return "needs CUDA"
        if self.fp8_only and not case.dtype.startswith("fp8"):
            return "for fp8 cases only"
        if case.causal and case.seqlen != case.kv_seqlen and self.name.startswith("sdpa"):
            return "SDPA's causal mask is top-left aligned; fa2gen's is bottom-right"
        return None


def _fa2gen(case, q, k, v):
    import fa2gen

    return lambda: fa2gen.attention(q, k, v, causal=case.causal)


def _fa2gen_default(case, q, k, v):
    """fa2gen with its heuristic default configs, forward and backward, skipping tuned
    lookups (the A/B baseline)."""
    from fa2gen.runtime.autograd import differentiable
    from fa2gen.runtime.backward import BackwardLaunch
    from fa2gen.runtime.defaults import bucket_default
    from fa2gen.runtime.device import cuda_device_info
    from fa2gen.runtime.launch import forward
    from fa2gen.runtime.problem import make_problem
    from fa2gen.store.buckets import Bucket

    problem = make_problem(q, k, v, causal=case.causal)
    arch = cuda_device_info(q.device.index or 0).arch if q.device.type == "cuda" else "cpu"
    params = bucket_default(Bucket.of(problem), arch)
    launches = None  # fp8 has no backward
    if not problem.kernel_spec().fp8:
        # autograd takes the backward launch kept here, as attention() keeps its dispatched one
        bwd = bucket_default(Bucket.of(problem, "bwd"), arch)
        launches = {False: BackwardLaunch(problem, bwd), True: BackwardLaunch(problem, bwd.replace(dq_mode="separate"))}

    def run():
        # Validation stays in the timed call, as in attention(), so both pay the same host cost.
        p = make_problem(q, k, v, causal=case.causal)
        return differentiable(q, k, v, p, functools.partial(forward, q, k, v, p, params), launches=launches)[0]

    return run


def _sdpa(backend_name: str):
    def build(case, q, k, v):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, backend_name)
        gqa = case.kv_heads != case.heads

        def run():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=case.causal, enable_gqa=gqa)

        return run

    return build


@functools.lru_cache(maxsize=1)
def _compiled_flex():
    import torch._dynamo
    from torch.nn.attention.flex_attention import flex_attention

    # Each shape recompiles; past the limit dynamo silently falls back to eager.
    torch._dynamo.config.recompile_limit = 10_000
    torch._dynamo.config.cache_size_limit = 10_000
    return torch.compile(flex_attention, dynamic=False)


def _flex(case, q, k, v):
    from torch.nn.attention.flex_attention import create_block_mask

    flex = _compiled_flex()
    block_mask = None
    if case.causal:
        offset = case.kv_seqlen - case.seqlen

        def causal(b, h, q_idx, kv_idx):
            return q_idx + offset >= kv_idx

        block_mask = create_block_mask(
            causal, B=None, H=None, Q_LEN=case.seqlen, KV_LEN=case.kv_seqlen, device=q.device
        )
    gqa = case.kv_heads != case.heads
    return lambda: flex(q, k, v, block_mask=block_mask, enable_gqa=gqa)


PROVIDERS: dict[str, Provider] = {
    p.name: p
    for p in (
        Provider("fa2gen", _fa2gen, cuda_only=False, takes_fp8=True),
        Provider("fa2gen-default", _fa2gen_default, cuda_only=False, takes_fp8=True),
        # fa2gen's own bf16 forward on the values an fp8 case holds: what fp8 is measured against
        Provider("fa2gen-bf16", _fa2gen, cuda_only=False, fp8_only=True),
        Provider("sdpa-cudnn", _sdpa("CUDNN_ATTENTION")),
        Provider("sdpa-flash", _sdpa("FLASH_ATTENTION")),
        Provider("sdpa-efficient", _sdpa("EFFICIENT_ATTENTION")),
        Provider("flex", _flex),
        Provider("sdpa-math", _sdpa("MATH"), cuda_only=False),
    )
}
GPU_DEFAULT = ("fa2gen", "fa2gen-default", "sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "flex")
CPU_DEFAULT = ("fa2gen", "sdpa-math")
