"""Work-arounds that make Triton's CPU interpreter compute what the GPU computes.

Triton 3.6's interpreter stores bf16 tensors as raw uint16 bits and feeds them to
numpy's matmul unconverted, so every bf16 ``tl.dot`` returns garbage. We wrap the
interpreter's dot to widen bf16 operands to fp32 first (exactly, by bit shift),
which is correct whether or not a later Triton fixes the bug upstream. It also has no
tensor-descriptor atomic add (a bulk reduction on the GPU); we give it one. And its
float downcasts round wrongly: to bf16 it truncates, and to fp8 e4m3 it drops the carry
when a mantissa rounds up past its top (127.2 becomes 64, not 128). Round-to-nearest
conversions to both go through PyTorch's, which rounds to nearest even as the GPU's
conversions do.
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


def _as_float32(data, dtype) -> np.ndarray:
    import triton.language as tl

    if dtype == tl.bfloat16:
        return (data.astype(np.uint32) << 16).view(np.float32)
    return np.asarray(data).astype(np.float32)


def _rounded_downcasts(original):
    """Triton's float conversion with round-to-nearest-even conversions to bf16 and e4m3 (from
    fp32, fp16 or bf16) done by PyTorch; an explicit other rounding mode (rtz) and every
    other conversion stay Triton's."""
    import torch
    import triton.language as tl
    from triton._C.libtriton import ir

    targets = {tl.bfloat16: (torch.bfloat16, torch.uint16), tl.float8e4nv: (torch.float8_e4m3fn, torch.uint8)}
    sources = (tl.float32, tl.float16, tl.bfloat16)

    def convert(input, input_dtype, output_dtype, rounding_mode):
        target = targets.get(output_dtype)
        nearest = rounding_mode in (None, ir.ROUNDING_MODE.RTNE)
        if target and nearest and input_dtype in sources and input_dtype != output_dtype:
            x = torch.from_numpy(np.ascontiguousarray(_as_float32(input, input_dtype)))
            return x.to(target[0]).view(target[1]).numpy().reshape(np.shape(input))
        return original(input, input_dtype, output_dtype, rounding_mode)

    return convert


def patch_interpreter() -> None:
    """Install the interpreter fixes (idempotent): the bf16 dot, descriptor atomic adds and
    rounding to bf16 and e4m3. They patch Triton's interpreter module for the whole process,
    which only ever runs the interpreter's kernels the GPU's way."""
    global _patched
    if _patched:
        return
    with _lock:
        if _patched:
            return
        from triton.runtime import interpreter
        from triton.runtime.interpreter import InterpreterBuilder

        original = InterpreterBuilder.create_dot

        def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
            return original(self, _widen_bf16(a), _widen_bf16(b), d, input_precision, max_num_imprecise_acc)

        InterpreterBuilder.create_dot = create_dot
        if not hasattr(InterpreterBuilder, "create_descriptor_reduce"):
            InterpreterBuilder.create_descriptor_reduce = _descriptor_reduce
        interpreter._convert_float = _rounded_downcasts(interpreter._convert_float)
        _patched = True
