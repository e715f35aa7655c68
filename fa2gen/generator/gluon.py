"""What the Gluon kernels' host side must agree on with them: the shared-memory layout of
each descriptor box (part of the descriptor's type, so the launch and an ahead-of-time
compile must build the same one), and the backward's boxes (the forward's are its
descriptor's, ``descriptors.attn_fwd_gluon``)."""

from __future__ import annotations

import functools


def descriptor_layout(block, dtype: str):
    """The swizzled shared-memory layout wgmma reads a 4-D box of ``dtype`` ("fp16", "bf16" or
    "fp8e4m3") from, or (``dtype`` "fp32") the one pass's dQ tile is reduced from."""
    return _layout(tuple(block), dtype)


def descriptor_dtype(spec, name: str) -> str:
    """The element type of a Gluon kernel's descriptor argument ``name``: the output's for O
    (bf16 for fp8), fp32 for the one pass's dQ sums (DQACC), the inputs' for the rest."""
    return spec.out_dtype if name == "O" else "fp32" if name == "DQACC" else spec.dtype


@functools.lru_cache(maxsize=None)
def _layout(block: tuple[int, ...], dtype: str):
    # Built once per box: Gluon derives it through its JIT path, about 25 us each, which a
    # launch building six descriptors would otherwise pay on every call. Layouts are frozen.
    from .. import compat

    return compat.nvmma_layout(block, dtype)


def backward_boxes(spec, params, kernel: str, ds_rows: int = 0) -> dict[str, list[int]]:
    """The boxes of a backward Gluon kernel's descriptors, by argument: block_m rows of what a
    program owns (attn_bwd_dkdv: K, V, DK, DV; attn_bwd_dq: Q, DO, DQ), or half of them with
    dq_mode atomic (the one pass's two compute partitions each own half of its keys), block_n
    rows of what a step takes; DST (dq_mode matmul) a step's dS^T, block_m keys by block_n queries;
    DQACC (dq_mode atomic) a step's fp32 dQ, block_n queries.
    attn_bwd_dq_ds (dq_mode matmul) reads the same keys a step, block_m, by ``ds_rows`` queries
    (its module's DS_ROWS), of dS^T and K."""
    if kernel == "attn_bwd_dq_ds":
        return {"DST": [1, 1, params.block_m, ds_rows], "K": [1, 1, params.block_m, spec.head_dim]}
    owned = ("K", "V", "DK", "DV") if kernel == "attn_bwd_dkdv" else ("Q", "DO", "DQ")
    rows = params.block_m // 2 if params.dq_mode == "atomic" else params.block_m
    boxes = {
        t: [1, 1, rows if t in owned else params.block_n, spec.head_dim]
        for t in ("Q", "K", "V", "DO", "DK", "DV", "DQ")
    }
    return {**boxes, "DST": [1, 1, params.block_m, params.block_n], "DQACC": [1, 1, params.block_n, spec.head_dim]}
