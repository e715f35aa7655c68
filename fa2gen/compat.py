"""Every touch of Triton's internals and experimental APIs, with one branch per Triton
version where they differ. Nothing else in fa2gen imports a private Triton name.

fa2gen runs on Triton 3.6 to 3.9, the versions torch 2.11 to 2.15 require. What moved
between them, and what each hook below answers:

| hook | 3.6 | 3.7 | 3.8 | 3.9 |
|---|---|---|---|---|
| ``barrier`` (Gluon) | ``gl.thread_barrier`` | ``gl.barrier`` | same | same |
| ``tma_load`` / ``tma_store`` (Gluon) | ``tma.async_copy_global_to_shared`` / ``..._shared_to_global`` | same | ``tma.async_load`` / ``async_store`` (old names kept) | new names only |
| ``tma_add`` (Gluon bulk reduction) | our builtin over the IR builder | same | ``tma.async_atomic_add`` | same |
| descriptor fields | base, shape, strides, block_shape, [layout], padding | + round_f32_to_tf32 | same | same |
| ``sums_in_tree()``: how a thread's values of a reduction are added | one chain | same | a tree | same |
| ``barrier_at_first_reader()``: where the barrier owed to a loop's TMA loads goes | at the first shared-memory op (the ring's wait) | at the first matmul that reads a loaded buffer | same | same |
| ``carried_accumulator_serialises()``: a wgmma accumulator in flight across a loop's back edge | kept in flight | ptxas serialises every wgmma (C7515) | same | same |
| ``ptxas(arch)`` for sm90 | ``bin/ptxas`` (CUDA 12.8) | same | ``bin/ptxas`` (12.9) | ``bin/ptxas-blackwell`` (13.4): the PTX 3.9 emits is newer than 12.x's ptxas reads |

The rest (launcher caches, allocator, interpreter internals, ahead-of-time sources) has
not moved across the four; each hook still lives here so that the next move is one edit.

Triton is imported lazily: TRITON_INTERPRET must be set before Triton's first import, and
importing this module must not be that import. The Gluon names are module attributes
resolved on first access (``from fa2gen.compat import tma_load`` in a rendered kernel).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import threading
import warnings

import numpy as np

# Oldest and newest Triton (major, minor) fa2gen is tested with.
OLDEST = (3, 6)
NEWEST = (3, 9)


@functools.lru_cache(maxsize=1)
def version() -> tuple[int, int]:
    """The installed Triton's (major, minor)."""
    import triton

    return parse_version(triton.__version__)


def parse_version(text: str) -> tuple[int, int]:
    """(major, minor) of a version string such as "3.9.0" or "3.7.1+git1234"."""
    found = re.match(r"(\d+)\.(\d+)", text)
    if not found:
        raise ValueError(f"not a Triton version: {text!r}")
    return int(found.group(1)), int(found.group(2))


def supported(ver: tuple[int, int] | None = None) -> bool:
    return OLDEST <= (ver or version()) <= NEWEST


# --- Gluon names the templates import -------------------------------------------------------


def sums_in_tree(ver: tuple[int, int] | None = None) -> bool:
    """Whether Triton ``ver`` (default: the installed) adds a thread's values of a reduction as
    a tree rather than one chain. From 3.8 it does, and ptxas then issues a softmax block's
    exponentials back to back: the Gluon forward sums its rows itself there (``chain_sum``)."""
    return (ver or version()) >= (3, 8)


def barrier_at_first_reader(ver: tuple[int, int] | None = None) -> bool:
    """Whether Triton ``ver`` (default: the installed) places the barrier that its
    shared-memory pass owes a loop's TMA loads (it counts them as writes by every thread) at
    the next step's first matmul that reads a loaded buffer. From 3.7 it does, which in the
    Gluon backward lands between a step's two first matmuls; 3.6 places it at the ring's
    mbarrier wait. The backward issues that barrier itself there (``ring_barrier``)."""
    return (ver or version()) >= (3, 7)


def carried_accumulator_serialises(ver: tuple[int, int] | None = None) -> bool:
    """Whether, under Triton ``ver`` (default: the installed), ptxas serialises every wgmma of a
    Gluon kernel that keeps a wgmma accumulator in flight across a loop's back edge
    (C7515: non-wgmma instructions define its registers within the pipeline stage). From 3.7
    it does: the Gluon dQ kernel then waits for each step's dQ matmul within the step
    (``dq_in_step``)."""
    return (ver or version()) >= (3, 7)


def _gluon_names() -> dict:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import tma

    new = version() >= (3, 8)
    return {
        "barrier": gl.barrier if version() >= (3, 7) else gl.thread_barrier,
        "tma_load": tma.async_load if new else tma.async_copy_global_to_shared,
        "tma_store": tma.async_store if new else tma.async_copy_shared_to_global,
        "tma_add": tma.async_atomic_add if new else _tma_add_builtin(),
    }


def _tma_add_builtin():
    """A shared-to-global bulk reduction (add) through a tensor descriptor, for the Gluon of
    Triton 3.6 and 3.7, which has the IR op but no language function for it."""
    from triton._C.libtriton import ir
    from triton.experimental.gluon.language._core import builtin

    @builtin
    def tma_add(desc, coord, src, _semantic=None):
        coord = _semantic._convert_to_ir_values(coord, require_i64=False)
        _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, desc.handle, coord, src.handle)

    return tma_add


GLUON_NAMES = ("barrier", "tma_load", "tma_store", "tma_add")
_names_lock = threading.Lock()


def __getattr__(name: str):
    if name in GLUON_NAMES:
        with _names_lock:
            names = _gluon_names()
            for key, value in names.items():
                globals()[key] = value
        return names[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def nvmma_layout(block: tuple[int, ...], dtype: str):
    """The swizzled shared-memory layout wgmma reads a ``block`` of ``dtype`` ("fp16",
    "bf16", "fp8e4m3", "fp32") from, as Gluon derives it."""
    from triton.experimental.gluon import language as gl

    element = {"fp16": gl.float16, "bf16": gl.bfloat16, "fp8e4m3": gl.float8e4nv, "fp32": gl.float32}[dtype]
    return gl.NVMMASharedLayout.get_default_for(list(block), element)


# --- tensor descriptors ----------------------------------------------------------------------

# The fields a descriptor can be built from without its constructor, with the value each
# takes when fa2gen does not set it. A class with any other field gets its constructor.
_FIELD_DEFAULTS = {"padding": "zero", "round_f32_to_tf32": False}
_FIELDS_SET = ("base", "shape", "strides", "block_shape", "layout")


@functools.lru_cache(maxsize=None)
def _descriptor_class(gluon: bool):
    """(the host descriptor class, the values of its fields fa2gen does not set where it may
    be built field by field, else None)."""
    import dataclasses

    if gluon:
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    else:
        from triton.tools.tensor_descriptor import TensorDescriptor
    fields = {f.name for f in dataclasses.fields(TensorDescriptor)}
    known = set(_FIELDS_SET if gluon else _FIELDS_SET[:-1])
    if not fields - known <= set(_FIELD_DEFAULTS) or hasattr(TensorDescriptor, "__slots__"):
        return TensorDescriptor, None
    return TensorDescriptor, {name: _FIELD_DEFAULTS[name] for name in fields - known}


_new = object.__new__


def descriptor_maker(box: list[int], layout=None):
    """The maker of host tensor descriptors with ``box``-shaped blocks, as a function of the
    tensor ``t``: a descriptor over the whole of ``t``, Triton's, or Gluon's where ``layout``
    (``nvmma_layout``, part of its type) is given. Rows and columns past ``t``'s extent read as
    zero. ``t`` must be 16-byte aligned in base and strides (``runtime.launch.tma_compatible``),
    which the constructor would check again: where the class allows, it is built field by field
    instead (about 2 us a descriptor, up to 11 a backward call). The class, its other fields
    and the box's check are resolved once (a launch binds one maker per descriptor argument)."""
    gluon = layout is not None
    cls, defaults = _descriptor_class(gluon)
    if defaults is None:
        extra = (layout,) if gluon else ()
        return lambda t: cls(t, list(t.shape), list(t.stride()), box, *extra)
    check_box(tuple(box))
    fixed = {**defaults, "block_shape": box, **({"layout": layout} if gluon else {})}

    def make(t):
        d = _new(cls)
        d.__dict__.update(fixed, base=t, shape=list(t.shape), strides=list(t.stride()))
        return d

    return make


@functools.lru_cache(maxsize=None)
def check_box(box: tuple[int, ...]) -> None:
    """Triton's own check of a descriptor's block shape (raises on a bad one)."""
    from triton._utils import validate_block_shape

    validate_block_shape(list(box))


# --- the allocator for in-kernel descriptors --------------------------------------------------


def ensure_allocator(allocate) -> None:
    """Set ``allocate`` as Triton's allocator (for in-kernel descriptors' scratch) unless the
    caller set one. Triton keeps it in a context variable that starts as a null allocator in
    every thread, so this runs per launch: one context-variable read."""
    import triton
    from triton.runtime import _allocation

    if _allocation._allocator.get() is _allocation._NULL_ALLOCATOR:
        triton.set_allocator(allocate)


# --- compiled launchers (runtime.direct) -------------------------------------------------------


class Launcher:
    """A JIT kernel's compiled launcher for one specialisation, called past Triton's per-call
    binding and cache lookup."""

    __slots__ = ("device", "tail", "_run", "_function", "_metadata", "_driver")

    def __init__(self, device, tail, run, function, metadata, driver):
        self.device, self.tail = device, tail
        self._run, self._function, self._metadata, self._driver = run, function, metadata, driver

    def current_device(self):
        return self._driver.get_current_device()

    def __call__(self, grid: tuple[int, int, int], args) -> None:
        stream = self._driver.get_current_stream(self.device)
        # launch metadata, enter hook, exit hook: none (launch_hooked() is checked by the caller)
        self._run(*grid, stream, self._function, self._metadata, None, None, None, *args, *self.tail)


def keep_launcher(kernel, grid, args, options) -> Launcher | None:
    """After ``kernel[grid](*args, **options)`` ran: its compiled launcher, with the
    arguments Triton appends after ``args`` (defaults, constexprs), or None where this
    Triton lacks the pieces or ``args`` are not the kernel's leading parameters."""
    try:
        from triton.runtime.driver import driver

        device = driver.active.get_current_device()
        compiled = kernel.warmup(*args, grid=grid, **options)  # the kernel the launch ran
        binder = kernel.device_caches[device][4]
        values = tuple(binder(*args, **options)[0].values())
        run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
    except Exception:  # noqa: BLE001 - no such pieces (the interpreter, another Triton, no kernel)
        return None
    if len(values) < len(args) or any(a is not b for a, b in zip(values, args)):
        return None
    return Launcher(device, values[len(args) :], run, function, metadata, driver.active)


@functools.lru_cache(maxsize=1)
def _stream_of():
    from triton.runtime.driver import driver

    return driver.active.get_current_stream


def current_stream(index: int) -> int:
    """The raw handle of device ``index``'s current stream, as the launchers read it (no
    ``torch.cuda.Stream`` object is made: a few us of host time a call)."""
    return _stream_of()(index)


def pre_run_hooks(kernel) -> list:
    """Triton's own list of a JIT kernel's pre-run hooks: hooks added later show in it."""
    return kernel.pre_run_hooks


@functools.lru_cache(maxsize=1)
def _knobs():
    # (kept: the direct launch path asks on every call)
    from triton import knobs

    return knobs


def launch_hooked() -> bool:
    """Whether a launch hook (a profiler) is set: Triton's hooks are chains, empty unless
    something added to them; a hook set in their place is a plain callable."""
    runtime = _knobs().runtime
    for h in (runtime.launch_enter_hook, runtime.launch_exit_hook):  # (asked on every direct launch)
        if h is not None and getattr(h, "calls", True):
            return True
    return False


@contextlib.contextmanager
def on_compile(hook):
    """Call ``hook(kernel_name, cache_key)`` after each kernel Triton compiles (or loads
    from its disk cache) while the block runs: how often a kernel was compiled."""
    runtime = _knobs().runtime
    previous = runtime.jit_post_compile_hook

    def called(*, key, fn, **_):
        hook(fn.name, str(key))
        if previous is not None:
            previous(key=key, fn=fn, **_)

    runtime.jit_post_compile_hook = called
    try:
        yield
    finally:
        runtime.jit_post_compile_hook = previous


def launch_modes() -> tuple:
    """Triton settings outside a launch's arguments that pick another compiled kernel."""
    knobs = _knobs()
    return knobs.runtime.debug, knobs.compilation.instrumentation_mode


# --- code generation options every compile requests ------------------------------------------

# Asked for explicitly rather than left to the default: Triton 3.9 warns that the default of
# enable_fp_fusion turns False in 3.10, and without fused multiply-adds the softmax and the
# rescaling take more instructions and round differently.
CODEGEN = {"enable_fp_fusion": True}


def codegen(options: dict) -> dict:
    """``options`` with ``CODEGEN``'s requests added, where ``options`` does not set them."""
    return {**CODEGEN, **options}


# --- ahead-of-time compiles (generator.ahead) --------------------------------------------------


def compile_triton(fn, signature: dict, constexprs: dict, attrs: dict, arch: str, options: dict):
    """A @triton.jit function compiled for ``arch`` ("sm90") without a GPU."""
    import triton
    from triton.compiler import ASTSource

    source = ASTSource(fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=_target(arch), options=codegen(options))


def compile_gluon(fn, signature: dict, constexprs: dict, attrs: dict, arch: str, options: dict):
    """A @gluon.jit function compiled for ``arch`` without a GPU; ``constexprs`` and
    ``attrs`` by argument name."""
    import triton
    from triton.experimental.gluon._runtime import GluonASTSource

    keys = {(fn.arg_names.index(k),): v for k, v in constexprs.items()}
    marks = {(fn.arg_names.index(k),): v for k, v in attrs.items()}
    return triton.compile(GluonASTSource(fn, signature, keys, marks), target=_target(arch), options=codegen(options))


def _target(arch: str):
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", int(arch.removeprefix("sm")), 32)


def ptxas(arch: str) -> str:
    """The ptxas this Triton assembles ``arch``'s PTX with (the backend's own choice: from
    3.9 on, sm90 takes the newer of its two)."""
    from triton.backends.nvidia.compiler import get_ptxas

    return get_ptxas(int(arch.removeprefix("sm"))).path


def nvidia_tool(name: str) -> str:
    """A tool Triton bundles (cuobjdump, nvdisasm)."""
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


# --- the CPU interpreter -----------------------------------------------------------------------
#
# Triton's interpreter stores bf16 tensors as raw uint16 bits and feeds them to numpy's
# matmul unconverted, so every bf16 ``tl.dot`` returns garbage: its dot is wrapped to widen
# bf16 operands to fp32 first (exactly, by bit shift), which stays right if Triton fixes it.
# It has no tensor-descriptor atomic add (a bulk reduction on the GPU): it gets one. Its float
# downcasts round wrongly (to bf16 it truncates; to e4m3 it drops the carry when a mantissa
# rounds past its top: 127.2 becomes 64, not 128): round-to-nearest conversions to both go
# through PyTorch's, which rounds to nearest even as the GPU does. The same in 3.6 to 3.9.

_interp_lock = threading.Lock()
_interp_patched = False


def interpreter_numpy_ok() -> bool:
    """Triton 3.6's interpreter breaks under numpy 2.4 or newer; 3.7 on do not."""
    return version() >= (3, 7) or tuple(int(x) for x in np.__version__.split(".")[:2]) < (2, 4)


def _widen_bf16(handle):
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    if handle.dtype.scalar == tl.bfloat16:
        bits = handle.data.astype(np.uint32) << 16
        return TensorHandle(bits.view(np.float32), tl.float32)
    return handle


def _descriptor_reduce(self, kind, desc, value, indices):
    """A tensor descriptor's atomic add: element-wise atomic adds over the block's in-bounds
    elements."""
    from triton._C.libtriton import ir

    if kind != ir.DESCRIPTOR_REDUCE_KIND.ADD:
        raise NotImplementedError(f"descriptor reduction {kind} under the interpreter")
    ptrs, mask = desc.materialize_pointers(indices)
    return self.create_atomic_rmw(ir.ATOMIC_OP.FADD, ptrs, value, mask, ir.MEM_SEMANTIC.RELAXED, ir.MEM_SYNC_SCOPE.GPU)


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
    """Install the interpreter fixes above (idempotent). They patch Triton's interpreter
    module for the whole process, which only ever runs the interpreter's kernels the GPU's way."""
    global _interp_patched
    if _interp_patched:
        return
    with _interp_lock:
        if _interp_patched:
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
        if not interpreter_numpy_ok():
            warnings.warn(
                f"fa2gen: Triton 3.6's CPU interpreter breaks under numpy >= 2.4 (numpy {np.__version__} "
                "is installed): pip install 'numpy<2.4', or Triton 3.7 or newer",
                RuntimeWarning,
                stacklevel=3,
            )
        _interp_patched = True
