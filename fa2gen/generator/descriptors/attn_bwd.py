"""attn_bwd.py.jinja: the Triton backward (delta, dK/dV, dQ), and the Gluon backward's delta
and dQ passes (``spec.triton_part``)."""

from __future__ import annotations

from .base import BackwardTemplate


class AttnBwd(BackwardTemplate):
    file = "attn_bwd.py.jinja"
    gluon = (0,)

    def flags(self, spec, params, triton):
        return {
            "dq_atomic": params.dq_mode in ("atomic", "tma_reduce"),  # dQ added into fp32 sums
            "dq_mode": params.dq_mode,
            "loads": params.loads,
            "mask": spec.mask,
            "pad_head": spec.head_dim != spec.head_dim_padded,
            "softcap": spec.softcap,
        }

    def smem(self, spec, params):
        # the P and dS tiles; with dq_mode tma_reduce also the fp32 dQ tile staged for its bulk
        # reduction
        staged_dq = params.block_n * spec.head_dim_padded * 4 if params.dq_mode == "tma_reduce" else 0
        return (
            self.owned_and_streamed(spec, params) + 2 * params.block_m * params.block_n * spec.element_bytes + staged_dq
        )

    def prune(self, arch, spec, params):
        # The Triton dK/dV kernel's dQ atomics lost every bucket of the H200 re-tune
        # (tuner.space.BWD_SPACES): on sm90 dq_mode atomic is the Gluon one pass only.
        if arch == "sm90" and params.dq_mode == "atomic":
            return (
                "dq_mode atomic on sm90 is the Gluon one pass (gluon=1); the Triton kernel's atomics lost every bucket"
            )
        return None
