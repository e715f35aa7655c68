"""Work-arounds that make Triton's CPU interpreter compute what the GPU computes.

Triton 3.6's interpreter stores bf16 tensors as raw uint16 bits and feeds them to
numpy's matmul unconverted, so every bf16 ``tl.dot`` returns garbage. We wrap the
interpreter's dot to widen bf16 operands to fp32 first (exactly, by bit shift),
which is correct whether or not a later Triton fixes the bug upstream. It also has no
tensor-descriptor atomic add (a bulk reduction on the GPU); we give it one.
"""

from __future__ import annotations

import threading

import numpy as np

_lock = threading.Lock()
_patched = False


def _widen_bf16(handle):
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    if handle.dtype.scalar == tl.bfloat16:
        bits = handle.data.astype(np.uint32) << 16
        return TensorHandle(bits.view(np.float32), tl.float32)
    return handle


def _descriptor_reduce(self, kind, desc, value, indices):
    """A tensor descriptor's atomic add (the GPU's bulk reduction), which Triton 3.6's
    interpreter lacks: element-wise atomic adds over the block's in-bounds elements."""
    from triton._C.libtriton import ir

    if kind != ir.DESCRIPTOR_REDUCE_KIND.ADD:
        raise NotImplementedError(f"descriptor reduction {kind} under the interpreter")
    ptrs, mask = desc.materialize_pointers(indices)
    return self.create_atomic_rmw(ir.ATOMIC_OP.FADD, ptrs, value, mask, ir.MEM_SEMANTIC.RELAXED,
                                  ir.MEM_SYNC_SCOPE.GPU)


def patch_interpreter() -> None:
    """Install the interpreter fixes (idempotent): the bf16 dot, and descriptor atomic adds."""
    global _patched
    if _patched:
        return
    with _lock:
        if _patched:
            return
        from triton.runtime.interpreter import InterpreterBuilder

        original = InterpreterBuilder.create_dot

        def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
            return original(self, _widen_bf16(a), _widen_bf16(b), d, input_precision, max_num_imprecise_acc)

        InterpreterBuilder.create_dot = create_dot
        if not hasattr(InterpreterBuilder, "create_descriptor_reduce"):
            InterpreterBuilder.create_descriptor_reduce = _descriptor_reduce
        _patched = True
