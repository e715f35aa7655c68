"""attn_fwd_gluon.py.jinja: the warp-specialised Gluon forward for Hopper."""

from __future__ import annotations

from ... import compat
from ..spec import gluon_overlap, gluon_wide
from .base import Template


class AttnFwdGluon(Template):
    file = "attn_fwd_gluon.py.jinja"
    direction = "fwd"
    gluon = (1, 2)

    def flags(self, spec, params, triton):
        return {
            "fp8": spec.fp8,
            "mask": spec.mask,
            # the derived forms, decided in spec.py for the template, the shared-memory
            # estimate and the tests alike
            "overlap": gluon_overlap(spec, params),
            "wide": gluon_wide(spec, params),
            # the softmax adds each row itself where Triton would add it as a tree
            "chain_sum": compat.sums_in_tree(triton),
        }
