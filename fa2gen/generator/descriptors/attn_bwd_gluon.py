"""attn_bwd_gluon.py.jinja: the Gluon backward for Hopper (dK/dV, and dQ with gluon=2 or by a
matmul); its delta and dQ passes come from attn_bwd.py.jinja (``spec.triton_part``)."""

from __future__ import annotations

from ... import compat
from ..spec import GLUON_HEAD_DIMS, GLUON_TILES, TuningParams
from .base import BackwardTemplate, Kernel, ints, packed_args, strides, tensors

GLUON_BWD_STEPS = (32, 64)  # queries per step of the Gluon dK/dV kernel
# dq_mode matmul's dQ kernel (attn_bwd_dq_ds): queries a program, its dS^T box's columns; under a
# causal mask also the band (BAND) in which the dK/dV kernel stores zero tiles
DS_ROWS = 128


# The backward's Gluon kernels. gluon=1, the dK/dV kernel (delta and dQ stay Triton's, with
# the same tiles, but for dq_mode matmul's and the one pass's dQ): on the H200 64 keys a
# program and 64 queries a step ran 1.27x fa2gen's dK/dV kernel, the best of five forms, and
# won every D=128 bucket of the re-tune; 128 x 32 is the Triton dQ kernel's own favourite
# tile at D=128 (the shipped backward defaults). gluon=2 adds the Gluon dQ kernel on the same
# tiles: 64 x 64 with two stages, and 128 x 32 with three (its dQ kernel prefetches
# num_stages - 1 key blocks; 64 x 64 with three spills in the dK/dV kernel at D=128 causal).
# dq_mode matmul on 64 x 64 tiles, which ran D=128 non-causal backwards 1.06-1.14x faster than
# the shipped ones on the H200, and on 64 x 32 with three stages; on 128 x 32 it lost to both
# (0.80-0.87x the shipped). dq_mode atomic, the one pass, on 128 keys and 64 queries a step
# (the only tile it takes; 128 x 32 steps ran it 1.2x slower).
GLUON_BWD_CANDIDATES = (
    TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=2, loads="tma_host", gluon=1),
    TuningParams(block_m=128, block_n=32, num_warps=8, num_stages=2, loads="tma_host", gluon=1),
    TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=2, loads="tma_host", gluon=2),
    TuningParams(block_m=128, block_n=32, num_warps=8, num_stages=3, loads="tma_host", gluon=2),
    TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=2, loads="tma_host", dq_mode="matmul", gluon=1),
    TuningParams(block_m=64, block_n=32, num_warps=4, num_stages=3, loads="tma_host", dq_mode="matmul", gluon=1),
    TuningParams(block_m=128, block_n=64, num_warps=8, num_stages=2, loads="tma_host", dq_mode="atomic", gluon=1),
)


class AttnBwdGluon(BackwardTemplate):
    file = "attn_bwd_gluon.py.jinja"
    gluon = (1, 2)

    def flags(self, spec, params, triton):
        return {
            "mask": spec.mask,
            "ds_rows": DS_ROWS,
            "varlen": spec.varlen,
            # the barrier owed to a step's TMA loads at the next step's ring wait, where Triton
            # would put it between that step's first two matmuls
            "ring_barrier": compat.barrier_at_first_reader(triton),
            # the dQ kernel's dQ matmul waited for within each step, where keeping it in flight
            # across steps would serialise every wgmma
            "dq_in_step": compat.carried_accumulator_serialises(triton),
        }

    def unsupported(self, spec, params):
        why = super().unsupported(spec, params)
        if why:
            return why
        if spec.mask not in ("none", "causal") or spec.softcap:
            return "the Gluon backward kernels take no mask or a causal one, without softcap"
        if spec.head_dim not in GLUON_HEAD_DIMS:
            return f"the Gluon backward kernels take head dims {GLUON_HEAD_DIMS}, not {spec.head_dim}"
        # (a packed batch: the base rules, in-kernel descriptors, dQ in its own kernel or the one pass)
        if not spec.varlen and (params.loads != "tma_host" or params.dq_mode not in ("separate", "matmul", "atomic")):
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

    def kernels(self, spec, params):
        """dK/dV; with gluon=2 the dQ kernel; with dq_mode matmul the kernel that computes dQ
        from the stored dS (in place of the Triton template's dQ kernel, whose tiles come from
        its descriptors' boxes). Delta and the others come from the Triton template.

        Boxes, in argument order: block_m rows of what a program owns (dK/dV: K, V, DK, DV;
        dQ: Q, DO, DQ), half of them with dq_mode atomic (each of the one pass's two compute
        partitions owns half the keys), block_n rows of what a step takes; DST (matmul) a
        step's dS^T, block_m keys by block_n queries; DQACC (atomic) a step's fp32 dQ, block_n
        queries. attn_bwd_dq_ds reads the same keys a step, block_m, by DS_ROWS queries, of dS^T
        and K."""
        d, m, n = spec.head_dim, params.block_m, params.block_n
        tiles = {"HEAD_DIM": d, "OUTER": m, "INNER": n, "STAGES": params.num_stages}
        rows = m // 2 if params.dq_mode == "atomic" else m
        boxes = {t: (1, 1, rows if t in ("K", "V", "DK", "DV") else n, d) for t in ("Q", "K", "V", "DO", "DK", "DV")}
        # the dK/dV kernel's dS^T (matmul) or dQ sums (atomic); the band of zero tiles (matmul)
        extra, band = (), ()
        if params.dq_mode == "matmul":
            boxes["DST"] = (1, 1, m, n)
            extra, band = tensors("DST"), ints("BAND")
        if params.dq_mode == "atomic":
            boxes["DQACC"] = (1, 1, n, d)
            extra = tensors("DQACC", "fp32")
        rows = tensors("LSE DELTA", "fp32")
        # a packed batch: pointers with their head and row strides (the kernels build each
        # sequence's descriptors), the sequences' offsets, and the packed query rows (Tq)
        packed, tq = (packed_args("Q K V DO DK DV"), ints("Tq")) if spec.varlen else ((), ())
        args = tensors("Q K V DO DK DV") + packed + extra + rows + self.sizes("Hkv") + tq + band
        dkdv = Kernel("attn_bwd_dkdv", args, tiles, boxes={} if spec.varlen else boxes, replaces="attn_bwd_dkdv")
        if params.gluon == 2:
            boxes = {t: (1, 1, m if t in ("Q", "DO", "DQ") else n, d) for t in ("Q", "K", "V", "DO", "DQ")}
            packed = packed_args("Q K V DO DQ") if spec.varlen else ()
            args = tensors("Q K V DO DQ") + packed + rows + self.sizes("Hq") + tq
            dq = Kernel("attn_bwd_dq", args, tiles, boxes={} if spec.varlen else boxes, replaces="attn_bwd_dq")
            return (dkdv, dq)
        if params.dq_mode == "matmul":
            boxes = {"DST": (1, 1, m, DS_ROWS), "K": (1, 1, m, d)}
            args = tensors("DST K DQ_PTR") + strides("DQ_PTR", "stride_b stride_h stride_n") + ints("Hq group Nq Nk")
            dq = Kernel("attn_bwd_dq_ds", args, {"HEAD_DIM": d}, boxes=boxes, replaces="attn_bwd_dq")
            return (dkdv, dq)
        return (dkdv,)

    def candidates(self, spec):
        if spec.varlen:  # (a packed batch: descriptors built in the kernels; dQ in its own kernel or the one pass)
            keep = ("separate", "atomic")
            return tuple(p.replace(loads="tma_device") for p in GLUON_BWD_CANDIDATES if p.dq_mode in keep)
        return GLUON_BWD_CANDIDATES

    def prune(self, arch, spec, params):
        # The one pass at D=128: its compute partitions need more registers than the worker's dQ
        # matmul leaves them (580-588 B spilled) and it ran 0.67-0.82x the shipped backward on the
        # H200; at D=64 nothing spills and it ran 1.06-1.20x from N=1k.
        if params.dq_mode == "atomic" and spec.head_dim != 64:
            return "the one pass (dq_mode atomic, gluon=1) spills above D=64 and measured slower there"
        # Under a causal mask dq_mode matmul's dQ kernel reads the key blocks each 128 queries see,
        # whose skipped tiles the dK/dV kernel zeroes: at D=128 it measured 1.04-1.08x the shipped
        # causal backward on the H200 from N=4k, faster still with the dQ kernel (the tuner
        # decides); at D=64, 0.94-0.96x the shipped one at N=4k and 16k, as it reads dS for twice
        # the heads a FLOP.
        if params.dq_mode == "matmul" and spec.mask == "causal" and spec.head_dim != 128:
            return "dq_mode matmul measured slower than the other backwards under a causal mask at D=64"
        return None
