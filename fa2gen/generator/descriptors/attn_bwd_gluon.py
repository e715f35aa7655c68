"""attn_bwd_gluon.py.jinja: the Gluon backward for Hopper (dK/dV, and dQ with gluon=2 or by a
matmul); its delta and dQ passes come from attn_bwd.py.jinja (``spec.triton_part``)."""

from __future__ import annotations

from ..spec import GLUON_HEAD_DIMS, GLUON_TILES
from .base import BackwardTemplate

GLUON_BWD_STEPS = (32, 64)  # queries per step of the Gluon dK/dV kernel


class AttnBwdGluon(BackwardTemplate):
    file = "attn_bwd_gluon.py.jinja"
    gluon = (1, 2)

    def flags(self, spec, params, triton):
        return {"mask": spec.mask}

    def unsupported(self, spec, params):
        why = super().unsupported(spec, params)
        if why:
            return why
        if spec.mask not in ("none", "causal") or spec.softcap:
            return "the Gluon backward kernels take no mask or a causal one, without softcap"
        if spec.head_dim not in GLUON_HEAD_DIMS:
            return f"the Gluon backward kernels take head dims {GLUON_HEAD_DIMS}, not {spec.head_dim}"
        if params.loads != "tma_host" or params.dq_mode not in ("separate", "matmul", "atomic"):
            return (
                "the Gluon backward kernels read through host descriptors, dQ in its own kernel, by a matmul or "
                "added from the dK/dV kernel: loads=tma_host, dq_mode=separate, matmul or atomic"
            )
        if params.dq_mode == "atomic" and params.gluon != 1:
            return "dq_mode atomic adds dQ from the Gluon dK/dV kernel: it needs gluon=1"
        if params.dq_mode == "atomic" and (params.block_m != 128 or params.block_n != 64):
            return (
                "dq_mode atomic's Gluon kernel takes 128 keys a program (two 64-key compute partitions) and 64 "
                "queries a step (the rows of its worker's dQ matmul, one warp group's wgmma)"
            )
        if params.block_m not in GLUON_TILES or params.block_n not in GLUON_BWD_STEPS:
            return (
                f"the Gluon backward kernels own {GLUON_TILES} rows and take {GLUON_BWD_STEPS} steps "
                "(dK/dV: keys, queries; dQ: queries, keys)"
            )
        if params.num_warps != params.block_m // 16:
            return "the Gluon backward kernels run block_m // 16 warps (16 keys each in dK/dV, 16 queries in dQ)"
        if params.num_stages < 2:
            return "the Gluon backward kernels' rings need num_stages >= 2"
        return None

    def smem(self, spec, params):
        # P and dS stay in registers. dq_mode matmul stages dS for its store, two tiles deep
        # (the one pass shares it, two deep); the one pass (atomic) also holds an fp32 scratch
        # tile of dQ for the adds.
        staged_ds = (
            2 * params.block_m * params.block_n * spec.element_bytes if params.dq_mode in ("matmul", "atomic") else 0
        )
        scratch = params.block_n * spec.head_dim_padded * 4 if params.dq_mode == "atomic" else 0
        return self.owned_and_streamed(spec, params) + staged_ds + scratch
