"""attn_fwd.py.jinja: the Triton forward, the fallback on every arch and the baseline."""

from __future__ import annotations

from .base import ForwardTemplate, Kernel, alibi_args, dropout_args, floats, ints, strides, tensors


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
            "varlen": spec.varlen,
            "alibi": spec.alibi,
            "dropout": spec.dropout,
        }

    def kernels(self, spec, params):
        constexprs = {
            "HEAD_DIM": spec.head_dim,
            "HEAD_DIM_PAD": spec.head_dim_padded,
            "BLOCK_M": params.block_m,
            "BLOCK_N": params.block_n,
        }
        options = {"num_warps": params.num_warps, "num_stages": params.num_stages}
        # packed batches: each sequence's first query and key row (B + 1 cumulative lengths)
        args = self.io_args(spec) + (tensors("CU_Q CU_K", "i32") if spec.varlen else ())
        boxes = {}
        if params.loads == "tma_host":  # host descriptors over Q, K, V and O; else their strides
            boxes = self.qkvo_boxes(spec, params.block_m, params.block_n, spec.head_dim_padded)
        else:  # (fp8's V is transposed: its third stride steps along the head dim)
            args += strides("Q", "stride_qb stride_qh stride_qm") + strides("K", "stride_kb stride_kh stride_kn")
            args += strides("V", f"stride_vb stride_vh stride_v{'d' if spec.fp8 else 'n'}")
            args += strides("O", "stride_ob stride_oh stride_om")
        args += self.descale_strides(spec) + ints("Hq group Nq Nk") + floats("sm_scale softcap")
        args += ints("win_left win_right") + (ints("num_tiles") if params.persistent else ())
        args += ints("Tq") if spec.varlen else ()  # (the packed query rows: LSE is (Hq, Tq))
        args += alibi_args(spec) + dropout_args(spec)
        return (Kernel("attn_fwd", args, constexprs, options, boxes),)

    def smem(self, spec, params):
        # Q, then K and V num_stages deep; on the pointer path P is staged for the second dot
        stages = max(1, params.num_stages)
        p = params.block_m * params.block_n * spec.element_bytes if params.loads == "pointer" else 0
        return self.tile_bytes(spec, params.block_m) + 2 * stages * self.tile_bytes(spec, params.block_n) + p

    def prune(self, arch, spec, params):
        # Hopper's wgmma is issued per warp group of 4 warps, 64 rows each: 8 warps on 64 rows
        # split the rows badly. Every such variant in the H200's fp16 forward sweep ran at 40-60%
        # of the best one.
        if arch == "sm90" and params.num_warps == 8 and params.block_m < 128:
            return "8 warps on sm90 need block_m >= 128 (two 64-row warp groups)"
        if arch == "sm90" and params.persistent == 1:
            return "one persistent Triton program an SM halves occupancy (0.32-0.78x the plain grid on the H200)"
        return None
