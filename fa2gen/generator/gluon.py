"""What the Gluon kernels' host side must agree on with them: the shared-memory layout of
each descriptor box (part of the descriptor's type, so the launch and an ahead-of-time
compile must build the same one). The boxes themselves are the templates' descriptors'."""

from __future__ import annotations

import functools


def descriptor_layout(block, dtype: str):
    """The swizzled shared-memory layout wgmma reads a 4-D box of ``dtype`` ("fp16", "bf16" or
    "fp8e4m3") from, or (``dtype`` "fp32") the one pass's dQ tile is reduced from."""
    return _layout(tuple(block), dtype)


@functools.lru_cache(maxsize=None)
def _layout(block: tuple[int, ...], dtype: str):
    # Built once per box: Gluon derives it through its JIT path, about 25 us each, which a
    # launch building six descriptors would otherwise pay on every call. Layouts are frozen.
    from .. import compat

    return compat.nvmma_layout(block, dtype)
