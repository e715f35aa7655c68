"""attn_bwd.py.jinja: the Triton backward (delta, dK/dV, dQ), and the Gluon backward's delta
and dQ passes (``spec.triton_part``)."""

from __future__ import annotations

from .base import Template


class AttnBwd(Template):
    file = "attn_bwd.py.jinja"
    direction = "bwd"
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
