"""attn_fwd.py.jinja: the Triton forward, the fallback on every arch and the baseline."""

from __future__ import annotations

from .base import Template


class AttnFwd(Template):
    file = "attn_fwd.py.jinja"
    direction = "fwd"
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
