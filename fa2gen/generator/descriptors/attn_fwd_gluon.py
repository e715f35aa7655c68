"""attn_fwd_gluon.py.jinja: the warp-specialised Gluon forward for Hopper."""

from __future__ import annotations

from ... import compat
from ..spec import GLUON_HEAD_DIMS, GLUON_TILES, KernelSpec, TuningParams
from .base import ForwardTemplate, Kernel, floats, ints, packed_args, tensors


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


# The Gluon forward's candidates every study of a space with it enqueues, after the default,
# the bucket's own entry and earlier winner and the nearest buckets' winners (so a study of 12
# trials or more measures them all): most of the space's gluon points fail the template's rules
# (warps fixed by block_m, host descriptors only), so a sampler alone rarely proposes a valid
# one. On the H200 two 64-row partitions on 128 x 128 tiles with two stages won 10 of 12
# canonical cells among the Gluon forms; one 64-row partition on 64 x 64 tiles with three
# stages was next at D=128 (on 64 x 128 it spills at D=128 under its 128-register limit).
# The persistent form is for short sequences, where a tile's prologue and epilogue are a
# large share of its time (on 128 x 128 tiles it spills at 168 registers, on 128 x 64 it does
# not). With three stages on 128 x 128 tiles the softmax runs under P @ V: 4-5% faster than
# the shipped forms at N=16k; K's ring there is a slot shorter than V's, so one persistent
# program an SM keeps three of V (4% faster than its two-stage form). 64 x 64 tiles with two
# or three programs an SM on the queue are for the short D=64 causal cells, where the Triton
# template's tiles ran 0.83-0.90x cuDNN; three (an 80-register launch) ran them 1.09-1.12x
# faster than two (D=64 only: at D=128 three do not fit).
GLUON_CANDIDATES = (
    TuningParams(block_m=128, block_n=128, num_warps=8, num_stages=2, loads="tma_host", gluon=2),
    TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=3, loads="tma_host", gluon=1),
    TuningParams(block_m=128, block_n=64, num_warps=8, num_stages=3, loads="tma_host", gluon=2),
    TuningParams(block_m=128, block_n=64, num_warps=8, num_stages=3, loads="tma_host", gluon=2, persistent=2),
    TuningParams(block_m=128, block_n=128, num_warps=8, num_stages=2, loads="tma_host", gluon=2, persistent=1),
    TuningParams(block_m=128, block_n=128, num_warps=8, num_stages=3, loads="tma_host", gluon=2),
    TuningParams(block_m=128, block_n=128, num_warps=8, num_stages=3, loads="tma_host", gluon=2, persistent=1),
    TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=3, loads="tma_host", gluon=1, persistent=2),
    TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=3, loads="tma_host", gluon=1, persistent=3),
)
# fp8 only: 256-key steps on the plain grid ran fp8 D=128 on the H200 1-3% faster than the
# shipped forms without a mask from N=4k and 8-9% under the causal mask at N=16k, 6-7% slower
# there at N=4k. They come first among the Gluon candidates, as a short study did not reach
# them last. One persistent program an SM on them (under the causal mask taking tiles from the
# queue) ran 4-10% faster than the plain grid without a mask and tied it under the mask.
GLUON_FP8_CANDIDATES = (
    TuningParams(block_m=128, block_n=256, num_warps=8, num_stages=2, loads="tma_host", gluon=2),
    TuningParams(block_m=128, block_n=256, num_warps=8, num_stages=2, loads="tma_host", gluon=2, persistent=1),
)


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
            "varlen": spec.varlen,
        }

    def unsupported(self, spec, params):
        why = super().unsupported(spec, params)
        if why:
            return why
        if spec.mask not in ("none", "causal") or spec.softcap:
            return "the Gluon forward takes no mask or a causal one, without softcap"
        if spec.head_dim not in GLUON_HEAD_DIMS:
            return f"the Gluon forward takes head dims {GLUON_HEAD_DIMS}, not {spec.head_dim}"
        # (a packed batch's descriptors are built in the kernel, one sequence each)
        loads = "tma_device" if spec.varlen else "tma_host"
        if params.loads != loads:
            return (
                f"the Gluon forward reads {'a packed batch' if spec.varlen else 'dense tensors'} through loads={loads}"
            )
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

    def kernels(self, spec, params):
        constexprs = {
            "HEAD_DIM": spec.head_dim,
            "BLOCK_M": params.block_m,
            "BLOCK_N": params.block_n,
            "STAGES": params.num_stages,
        }
        # the causal persistent form, and a packed batch's, take their tiles from a counter (TILES)
        queue = tensors("TILES", "i32") if params.persistent and (spec.mask == "causal" or spec.varlen) else ()
        args = self.io_args(spec) + self.descale_strides(spec) + queue
        if spec.varlen:
            # pointers with their head and row strides (the kernel builds each sequence's
            # descriptors), and the sequences' offsets
            args += packed_args("Q K V O", query_rows="Q O")
            boxes = {}
        else:
            # each compute partition loads and stores its own rows of Q and O
            boxes = self.qkvo_boxes(spec, params.block_m // params.gluon, params.block_n, spec.head_dim)
        args += ints("Hq group Nq Nk") + floats("sm_scale") + ints("num_tiles")
        args += ints("Tq") if spec.varlen else ()  # (the packed query rows: LSE is (Hq, Tq))
        return (Kernel("attn_fwd", args, constexprs, boxes=boxes),)

    def candidates(self, spec):
        # fp8's own first: a short study reaches only the warm start's head (the bucket's own
        # and earlier entries and the neighbours' come before the candidates)
        # A packed batch: descriptors built per sequence, on the plain grid or one persistent
        # program an SM on 128 x 128 tiles (the persistent forms its GPU tests cover)
        if spec.varlen:
            keep = [p for p in GLUON_CANDIDATES if not p.persistent or (p.persistent == 1 and p.block_n == 128)]
            return tuple(p.replace(loads="tma_device") for p in keep)
        return (GLUON_FP8_CANDIDATES if spec.fp8 else ()) + GLUON_CANDIDATES

    def prune(self, arch, spec, params):
        # Two persistent programs an SM on 128 x 128 tiles: their shared memory fits two only at
        # D=64, where one a SM measured the same. One a SM spills 24-204 B (ptxas for sm90, fp16
        # D=64 to D=128) and still ran short sequences 1.05-1.12x faster than the shipped configs
        # on the H200, as cuDNN's own short forward is persistent on 128-key blocks.
        if params.persistent == 2 and params.block_m == 128 and params.block_n == 128:
            return "two persistent Gluon programs an SM on 128 x 128 tiles: their shared memory fits two only at D=64"
        # fp8's 256-key steps: two persistent programs an SM do not fit its shared memory at D=128
        # (one takes 176 KB); one an SM masks its first block with an opaque zero, without which
        # it spilled 664 B.
        if spec.fp8 and params.block_n == 256 and params.persistent == 2:
            return "fp8's 256-key Gluon steps: one persistent program an SM at most"
        return None
