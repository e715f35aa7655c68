"""attn_fwd.py.jinja: the Triton forward, the fallback on every arch and the baseline."""

from __future__ import annotations

from .base import ForwardTemplate


class AttnFwd(ForwardTemplate):
    file = "attn_fwd.py.jinja"
    gluon = (0,)

    def flags(self, spec, params, triton):
        return {
            "fp8": spec.fp8,
            "loads": params.loads,
            "mask": spec.mask,
            "pad_head": spec.head_dim != spec.head_dim_padded,
            "persistent": params.persistent,
            "softcap": spec.softcap,
        }

    def smem(self, spec, params):
        # Q, then K and V num_stages deep; on the pointer path P is staged for the second dot
        stages = max(1, params.num_stages)
        p = params.block_m * params.block_n * spec.element_bytes if params.loads == "pointer" else 0
        return self.tile_bytes(spec, params.block_m) + 2 * stages * self.tile_bytes(spec, params.block_n) + p
