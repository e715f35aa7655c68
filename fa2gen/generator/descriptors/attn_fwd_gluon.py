"""attn_fwd_gluon.py.jinja: the warp-specialised Gluon forward for Hopper."""

from __future__ import annotations

from ... import compat
from ..spec import GLUON_HEAD_DIMS, GLUON_TILES, KernelSpec, TuningParams
from .base import ForwardTemplate


def gluon_overlap(spec: KernelSpec, params: TuningParams) -> bool:
    """Whether the Gluon forward runs each block's softmax under the previous block's P @ V
    (the template's ``overlap``): two partitions on 128 x 128 tiles, three stages or more,
    16-bit. Only where it measured faster on the H200 (4-6.5%): V's slot goes back a step
    later, which a two-stage ring cannot spare (4-8% slower there); on 128 x 64 tiles with
    three stages it ran 0.97-1.02x, in fp8 slower with either."""
    return (
        spec.direction == "fwd"
        and params.gluon == 2
        and params.block_m == 128
        and params.block_n == 128
        and params.num_stages >= 3
        and not spec.fp8
    )


def gluon_wide(spec: KernelSpec, params: TuningParams) -> bool:
    """Whether the Gluon forward takes fp8's 256-key steps (the template's ``wide``), on two
    64-row partitions: each step's fixed costs are spread over twice the keys. 64 x 256 scores
    take 128 registers a thread, so P @ V and the next scores' matmul take turns (with both in
    flight the registers spilled)."""
    return spec.direction == "fwd" and spec.fp8 and params.block_n == 256 and params.gluon == 2


def gluon_k_stages(spec: KernelSpec, params: TuningParams) -> int:
    """K's ring depth: one slot fewer than V's with the overlapped softmax, whose K slots go back
    a step before V's, else num_stages."""
    return params.num_stages - 1 if gluon_overlap(spec, params) else params.num_stages


class AttnFwdGluon(ForwardTemplate):
    file = "attn_fwd_gluon.py.jinja"
    gluon = (1, 2)

    def flags(self, spec, params, triton):
        return {
            "fp8": spec.fp8,
            "mask": spec.mask,
            # the derived forms, one decision for the template, the shared-memory estimate and
            # the tests alike
            "overlap": gluon_overlap(spec, params),
            "wide": gluon_wide(spec, params),
            # the softmax adds each row itself where Triton would add it as a tree
            "chain_sum": compat.sums_in_tree(triton),
        }

    def unsupported(self, spec, params):
        why = super().unsupported(spec, params)
        if why:
            return why
        if spec.mask not in ("none", "causal") or spec.softcap:
            return "the Gluon forward takes no mask or a causal one, without softcap"
        if spec.head_dim not in GLUON_HEAD_DIMS:
            return f"the Gluon forward takes head dims {GLUON_HEAD_DIMS}, not {spec.head_dim}"
        if params.loads != "tma_host":
            return "the Gluon forward reads through host descriptors: loads=tma_host"
        if params.block_m not in GLUON_TILES or (params.block_n not in GLUON_TILES and not gluon_wide(spec, params)):
            return f"the Gluon forward's tiles are {GLUON_TILES} rows (fp8 with two partitions: also 256 keys a step)"
        if params.gluon == 2 and params.block_m != 128:
            return "gluon=2 splits block_m=128 into two 64-row warp groups"
        if params.num_warps != params.block_m // 16:
            return "the Gluon forward runs block_m // 16 compute warps (16 query rows each)"
        if params.num_stages < 2:
            return "the Gluon forward's K/V ring needs num_stages >= 2"
        # At D=128 ptxas cannot fit fp8's wgmma in the 80 registers of a three-program launch,
        # and 16-bit Q, K and V leave shared memory for two programs an SM at most
        if params.persistent == 3 and spec.head_dim != 64:
            return "three Gluon programs an SM (persistent=3) run at head dim 64 only"
        return None

    def smem(self, spec, params):
        # Q (two slots in a persistent program: the next tile's Q lands while this one runs), K
        # (gluon_k_stages) and V rings, and for fp8 an O buffer of its own (bf16, twice Q's
        # size; 16-bit O goes through Q's)
        q = self.tile_bytes(spec, params.block_m) * (2 if params.persistent else 1)
        kv = (gluon_k_stages(spec, params) + params.num_stages) * self.tile_bytes(spec, params.block_n)
        o = params.block_m * spec.head_dim_padded * 2 if spec.fp8 else 0
        return q + kv + o
