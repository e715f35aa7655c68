"""attn_decode.py.jinja: attention over a KV cache, contiguous or paged, split along the keys
(appending new keys, the split kernel, the combine)."""

from __future__ import annotations

from ..spec import KernelSpec, TuningParams
from .base import Kernel, Knob, Template, alibi_args, floats, ints, strides, tensors

# Rows of new keys one append program copies
APPEND_ROWS = 16
# A page holds a multiple of this many keys
PAGE_ROWS = 16
# Splits of a sequence's keys the combine kernel reads at most (its tile's first dim)
MAX_SPLITS = 128


def combine_warps(splits_pad: int, head_dim_padded: int) -> int:
    """Warps of the combine kernel, which holds splits_pad x head_dim_padded fp32 values: at most
    64 a thread (128 x 256 in 4 warps spilled 68 B on sm90)."""
    return max(4, min(16, splits_pad * head_dim_padded // (64 * 32)))


def _cache_strides(tensor: str, prefix: str):
    # a contiguous cache is (B, S, Hkv, D); a paged one (num_blocks, page_size, Hkv, D)
    return strides(tensor, f"stride_{prefix}b stride_{prefix}n stride_{prefix}h")


class AttnDecode(Template):
    file = "attn_decode.py.jinja"
    direction = "decode"
    gluon = (0,)
    knobs = (
        Knob(
            "splits",
            values=(0, 1, 2, 4, 8, 16, 32, 64, 128),
            default=0,
            help="programs a sequence's keys are split across (0: as many as fill the GPU, "
            "runtime.defaults.decode_splits)",
            searched={"sm90": (0, 1, 2, 4, 8, 16, 32, 64)},
        ),
        Knob(
            "combine",
            values=("auto", "kernel", "last"),
            default="auto",
            help="where split partials are combined: a kernel of their own, or the split of each "
            "tile that finishes last (one launch fewer; auto: last with two splits, "
            "runtime.defaults.decode_combine)",
            searched={"sm90": ("auto", "kernel", "last")},
        ),
    )

    def flags(self, spec, params, triton):
        return {
            "mask": spec.mask,
            "pad_head": spec.head_dim != spec.head_dim_padded,
            "paged": spec.paged,
            "alibi": spec.alibi,
            "softcap": spec.softcap,
        }

    def unsupported(self, spec: KernelSpec, params: TuningParams) -> str | None:
        if params.loads != "pointer" or params.persistent or params.gluon or params.dq_mode != "separate":
            return "the decode template has pointer loads on a plain grid (the cache is gathered through pages)"
        return None

    def kernels(self, spec, params):
        """append_kv, attn_decode and attn_decode_combine. SPLIT (whether attn_decode writes
        partials), COMBINE_LAST (whether its last split combines them), SPLITS_PAD (the
        combine's padded split count) and PAGE_SIZE (the cache's) are the launch's: it chooses
        the number of splits (``runtime.kvcache``). PAGE_SIZE is given here as the smallest
        page, which a compile ahead of time builds."""
        dims = {"HEAD_DIM": spec.head_dim, "HEAD_DIM_PAD": spec.head_dim_padded}
        options = {"num_warps": params.num_warps, "num_stages": params.num_stages}
        table = tensors("BLOCK_TABLE", "i32") if spec.paged else ()
        pages = strides("BLOCK_TABLE", "stride_tb") if spec.paged else ()
        # (a page size that is a constant costs a shift, not a division, per key row)
        page = {"PAGE_SIZE": PAGE_ROWS} if spec.paged else {}
        cache = _cache_strides("K", "k") + _cache_strides("V", "v")
        append = Kernel(
            "append_kv",
            tensors("K_NEW V_NEW K V")
            + tensors("CACHE_SEQLENS", "i32")
            + table
            + strides("K_NEW", "stride_knb stride_knn stride_knh")
            + strides("V_NEW", "stride_vnb stride_vnn stride_vnh")
            + cache
            + pages
            + ints("Hkv Sk_new"),
            {**dims, "APPEND_ROWS": APPEND_ROWS, **page},
            {"num_warps": 4, "num_stages": 1},
        )
        decode = Kernel(
            "attn_decode",
            tensors("Q K V")
            + tensors("O", "out")
            + tensors("LSE O_PART LSE_PART", "fp32")
            + tensors("COUNTS CACHE_SEQLENS", "i32")
            + table
            + strides("Q", "stride_qb stride_qs stride_qh")
            + cache
            + strides("O", "stride_ob stride_os stride_oh")
            + pages
            + ints("Hq group Sq Sk_new batch num_splits")
            + floats("sm_scale softcap")
            + ints("win_left win_right")
            + alibi_args(spec),
            {**dims, "BLOCK_M": params.block_m, "BLOCK_N": params.block_n, "SPLIT": 1, "COMBINE_LAST": 0, **page},
            options,
        )
        combine = Kernel(
            "attn_decode_combine",
            tensors("O_PART LSE_PART", "fp32")
            + tensors("O", "out")
            + tensors("LSE", "fp32")
            + strides("O", "stride_ob stride_os stride_oh")
            + ints("Hq Sq rows num_splits"),
            {**dims, "SPLITS_PAD": MAX_SPLITS},
            {"num_warps": combine_warps(MAX_SPLITS, spec.head_dim_padded), "num_stages": 1},
        )
        return (append, decode, combine)

    def smem(self, spec, params):
        # Q resident, K and V num_stages deep, P staged for the second matmul
        rows = params.block_m + 2 * max(1, params.num_stages) * params.block_n
        return rows * spec.head_dim_padded * spec.element_bytes + params.block_m * params.block_n * spec.element_bytes
