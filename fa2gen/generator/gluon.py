"""What the Gluon forward's host side must agree on with its kernel: the shared-memory
layout of each descriptor box (part of the descriptor's type, so the launch and an
ahead-of-time compile must build the same one)."""

from __future__ import annotations


def descriptor_layout(block: list[int], dtype: str):
    """The swizzled shared-memory layout wgmma reads a (1, 1, rows, D) box of ``dtype``
    ("fp16" or "bf16") from."""
    from triton.experimental.gluon import language as gl

    element = {"fp16": gl.float16, "bf16": gl.bfloat16}[dtype]
    return gl.NVMMASharedLayout.get_default_for(block, element)
