"""attn_bwd_gluon.py.jinja: the Gluon backward for Hopper (dK/dV, and dQ with gluon=2 or by a
matmul); its delta and dQ passes come from attn_bwd.py.jinja (``spec.triton_part``)."""

from __future__ import annotations

from .base import Template


class AttnBwdGluon(Template):
    file = "attn_bwd_gluon.py.jinja"
    direction = "bwd"
    gluon = (1, 2)

    def flags(self, spec, params, triton):
        return {"mask": spec.mask}
