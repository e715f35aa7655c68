"""Launch one generated forward variant on validated tensors."""

from __future__ import annotations

import functools

import torch

from .. import compat
from ..generator.cache import interpreting, load_module
from ..generator.descriptors import template_of
from ..generator.spec import TMA_LOADS, TuningParams
from . import direct
from .binding import Binding
from .fp8 import check_descales, transposed_v
from .problem import Problem

_ALIGN = 16  # bytes: tensor descriptors need 16-byte aligned bases and strides


def tma_compatible(*tensors: torch.Tensor, in_kernel: bool = False) -> bool:
    """Whether every tensor can be addressed by a tensor descriptor. ``in_kernel``: by the
    forward's in-kernel descriptors, one per (batch, head) over rows and columns, whose batch
    and head strides only move the base: those may be 0 (a packed batch's views)."""
    # (asked on every launch: a call's strides recur, its base address may not)
    for t in tensors:
        if t.data_ptr() % _ALIGN or not _strides_compatible(t.stride(), t.element_size(), in_kernel):
            return False
    return True


@functools.lru_cache(maxsize=1024)
def _strides_compatible(strides: tuple[int, ...], size: int, in_kernel: bool) -> bool:
    """``tma_compatible``'s test of one tensor's strides (elements of ``size`` bytes)."""
    if strides[-1] != 1:
        return False
    outer = strides[:-1]
    for i, s in enumerate(outer):
        zero_ok = in_kernel and i < len(outer) - 1
        if s < 0 or (s == 0 and not zero_ok) or (s * size) % _ALIGN:
            return False
    return True


def _scratch(size: int, alignment: int, stream) -> torch.Tensor:
    # In-kernel descriptors live in a per-launch global scratch buffer (128 B each).
    return torch.empty(size, dtype=torch.int8, device="cuda")


def ensure_allocator() -> None:
    """Give Triton an allocator for in-kernel descriptors, unless the caller set one."""
    compat.ensure_allocator(_scratch)


def effective_params(spec, params: TuningParams, *tensors: torch.Tensor) -> TuningParams:
    """``params`` with tensor-descriptor loads swapped for pointers where the tensors forbid
    them (no tensors given: unconditionally). Pointer loads stage more in shared memory, so
    the swapped config is shrunk until it fits again (descriptors exist only on sm90, so
    sm90's limits apply)."""
    if params.loads in TMA_LOADS and not (tensors and tma_compatible(*tensors)):
        from .defaults import shrink_to_fit

        # (dQ's bulk reduction goes through a descriptor too: per-element atomics instead)
        dq_mode = "atomic" if params.dq_mode == "tma_reduce" else params.dq_mode
        return shrink_to_fit(spec, params.replace(loads="pointer", dq_mode=dq_mode), "sm90")
    return params


# A plain Gluon grid puts batch * heads on its second axis, which CUDA caps.
GRID_Y_MAX = 65535


def gluon_device_ready(
    problem: Problem, device: torch.device, *, persistent: int = 0, heads: int | None = None
) -> bool:
    """Whether a Gluon kernel can run ``problem`` on ``device``: compiled Triton on a Hopper
    GPU (wgmma exists on sm90 only), and a grid CUDA accepts (a persistent one numbers its
    tiles in 32 bits; a plain one has batch * ``heads`` programs on its second axis: the
    query heads, or the backward's k/v heads)."""
    heads = problem.heads_q if heads is None else heads
    tiles_fit = (
        problem.batch * problem.heads_q * problem.seqlen_q < 2**31
        if persistent
        else problem.batch * heads <= GRID_Y_MAX
    )
    if interpreting() or device.type != "cuda" or not tiles_fit:
        return False
    from .device import cuda_device_info

    return (
        cuda_device_info(device.index if device.index is not None else torch.cuda.current_device()).capability[0] == 9
    )


class GluonDevices:
    """``gluon_device_ready`` for one problem and grid, asked once per device (a kept launch
    holds one): the tensors still need ``tma_compatible`` on every call."""

    __slots__ = ("problem", "persistent", "heads", "_verdicts")

    def __init__(self, problem: Problem, *, persistent: int = 0, heads: int | None = None):
        self.problem, self.persistent, self.heads = problem, persistent, heads
        self._verdicts: dict[torch.device, bool] = {}

    def __call__(self, device: torch.device) -> bool:
        ready = self._verdicts.get(device)
        if ready is None:
            ready = self._verdicts[device] = gluon_device_ready(
                self.problem, device, persistent=self.persistent, heads=self.heads
            )
        return ready


def gluon_ready(problem: Problem, *tensors: torch.Tensor, persistent: int = 0, heads: int | None = None) -> bool:
    """Whether a Gluon kernel can run this call: on the tensors' device (``gluon_device_ready``),
    and on tensors a descriptor can address."""
    return gluon_device_ready(problem, tensors[0].device, persistent=persistent, heads=heads) and tma_compatible(
        *tensors
    )


# Under the interpreter a persistent grid this small makes every program walk several tiles.
_INTERPRETER_SMS = 3


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return _INTERPRETER_SMS
    from .device import cuda_device_info

    return cuda_device_info(device.index if device.index is not None else torch.cuda.current_device()).sm_count


def window_extents(problem: Problem) -> tuple[int, int]:
    """The (left, right) window as the kernels take it. Unbounded (or larger-than-the-problem)
    extents become a distance no row can exceed; clamping also keeps the kernels' 32-bit
    bound arithmetic from overflowing."""
    unbounded = problem.seqlen_q + problem.seqlen_k
    left = unbounded if problem.window_left < 0 else min(problem.window_left, unbounded)
    right = unbounded if problem.window_right < 0 else min(problem.window_right, unbounded)
    return left, right


_COUNTERS: dict[tuple[int, int], torch.Tensor] = {}


def zero_counters(device: torch.device, n: int) -> torch.Tensor:
    """At least ``n`` int32 zeros on ``device``'s current stream, for a kernel whose programs
    count up in them and whose last program sets them back to zero: the causal persistent Gluon
    forward's tile counter, the decode kernel's counts of finished splits. Kernels of one
    stream run in turn, so they share one buffer; two streams could run two kernels at once,
    so each stream has its own. Under graph capture each launch gets zeros of its own, whose
    fill the graph replays before it: a buffer first made during capture would be filled only
    on replay, and every graph is captured on one stream."""
    if torch.cuda.is_current_stream_capturing():
        return torch.zeros(n, dtype=torch.int32, device=device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, compat.current_stream(index))
    counters = _COUNTERS.get(key)
    if counters is None or counters.numel() < n:  # (a larger one replaces it: both are zero)
        counters = _COUNTERS[key] = torch.zeros(
            max(n, 2 * (0 if counters is None else counters.numel())), dtype=torch.int32, device=device
        )
    return counters


def descriptor_maker(spec, kernel, gluon: bool):
    """``Binding``'s maker of host descriptors for ``kernel``'s descriptor arguments, each over a
    whole 4-D tensor ((B, H, N, D), or fp8's transposed V) with the argument's box: rows and
    columns past the tensor read as zero and are not written. Gluon's carry the shared-memory
    layout of their box and element type (part of a Gluon kernel's type, built once here, not
    per call). The tensors must have passed ``tma_compatible``."""

    def make(name: str, box: tuple[int, ...]):
        layout = None
        if gluon:
            from ..generator.gluon import descriptor_layout

            layout = descriptor_layout(box, kernel.element(spec, name))
        return compat.descriptor_maker(list(box), layout)

    return make


def bound(spec, kernel, module, fixed, gluon: bool, dims=None) -> tuple:
    """(function, ``Binding``, launch options) of one kernel of a loaded ``module``: its
    descriptor's constexprs with its options (a Gluon kernel's: its module's ``LAUNCH``).
    ``dims``: ``Binding``'s, for tensors given in another dim order."""
    launch = module.LAUNCH if kernel.options is None else kernel.options
    binding = Binding(kernel, fixed, descriptor_maker(spec, kernel, gluon), dims)
    return getattr(module, kernel.name), binding, compat.codegen({**kernel.constexprs, **launch})


class Launch:
    """What one launch needs that depends on the problem and the params, not on where
    the tensors live: built once per call shape by ``attention()`` and reused."""

    __slots__ = (
        "problem",
        "params",
        "spec",
        "kernel",
        "module",
        "grid",
        "tiles",
        "fixed",
        "bound",
        "_queue",
        "_fallback",
        "_gluon_devices",
        "backward",
        "_direct",
    )

    def __init__(self, problem: Problem, params: TuningParams, sm_count: int | None = None):
        """``sm_count``: the device's SM count, which sizes a persistent grid (None: looked up
        at the first run)."""
        self.problem = problem
        self.params = params
        self.spec = spec = problem.kernel_spec()
        # the kernel, its arguments, constexprs, options and descriptor boxes
        [self.kernel] = template_of(spec, params).kernels(spec, params)
        self.module = self.bound = None  # on first run: the interpreter check happens there
        self._fallback = None
        # The backward launches of calls of this shape (runtime.autograd fills it), by
        # whether the backward must be deterministic.
        self.backward = {}
        self._direct = {}  # the kernel's launcher, kept by runtime.direct
        self._gluon_devices = GluonDevices(problem, persistent=params.persistent) if params.gluon else None
        # One program per (query block, batch * head) tile (a Gluon grid has them on two axes),
        # or a persistent grid walking them
        num_m = -(-problem.seqlen_q // params.block_m)
        self.tiles = tiles = num_m * problem.batch * problem.heads_q
        self.grid = (num_m, problem.batch * problem.heads_q) if params.gluon else (tiles,)
        if params.persistent:
            self.grid = None if sm_count is None else (min(tiles, params.persistent * sm_count),)
        left, right = window_extents(problem)
        self.fixed = dict(
            Hq=problem.heads_q,
            group=problem.group,
            Nq=problem.seqlen_q,
            Nk=problem.seqlen_k,
            sm_scale=problem.sm_scale,
            softcap=problem.softcap,
            win_left=left,
            win_right=right,
            num_tiles=tiles,
            Tq=problem.total_q,
        )
        # the causal persistent Gluon forward takes its tiles from a counter
        self._queue = any(a.name == "TILES" for a in self.kernel.args)

    def fallback(self) -> "Launch":
        """The launch to run where this one cannot: with pointer loads for tensors descriptors
        cannot address; the Triton template's default where the Gluon forward cannot run."""
        if self._fallback is None:
            if self.params.gluon:
                from .defaults import default_params
                from .device import cuda_device_info

                arch = "cpu" if interpreting() else cuda_device_info(torch.cuda.current_device()).arch
                params = default_params(self.spec, arch, self.problem.seqlen_q)
            else:
                params = effective_params(self.spec, self.params)
            self._fallback = Launch(self.problem, params)
        return self._fallback

    def run(
        self, q, k, v, out, lse, *, descales=None, cu_seqlens=None, alibi=None, dropout=None, compile_only: bool = False
    ) -> None:
        """``descales``: for fp8 inputs, the three (factor, stride_b, stride_h) of
        ``fp8.check_descales``; ``v`` is then given as it is and staged transposed here.
        ``cu_seqlens``: a packed batch's (cu_seqlens_q, cu_seqlens_k), with q, k, v and out as
        ``runtime.varlen.batch_view`` gives them. ``alibi``: ALiBi's (slopes, batch stride) of
        ``problem.check_alibi``. ``dropout``: (seed, dropout_p) of ``runtime.dropout``."""
        self._launch(q, k, v, out, lse, descales, compile_only, cu_seqlens, alibi, dropout)

    def staged_v(self, v: torch.Tensor) -> torch.Tensor:
        """V as this launch's kernel reads it: for fp8, transposed, and with its keys in P's
        order where the kernel is the Gluon one (``transposed_v(key_order=True)``)."""
        return transposed_v(v, key_order=bool(self.params.gluon), kept=self._direct) if self.spec.fp8 else v

    def _launch(
        self, q, k, v, out, lse, descales, compile_only: bool, cu_seqlens=None, alibi=None, dropout=None
    ) -> None:
        # fp8's staged V is new, contiguous and padded for descriptors: only the caller's
        # tensors decide where the kernel runs, and V is staged once, for the kernel that does
        given = (q, k, out) if self.spec.fp8 else (q, k, v, out)
        in_kernel = self.params.loads == "tma_device"
        if self.params.gluon:
            # (a packed batch's descriptors read a key even where its sequence has none: there
            # must be one)
            runs_here = (
                self._gluon_devices(q.device)
                and tma_compatible(*given, in_kernel=in_kernel)
                and not (cu_seqlens is not None and k.shape[2] == 0)
            )
        else:
            runs_here = self.params.loads not in TMA_LOADS or tma_compatible(*given, in_kernel=in_kernel)
        if not runs_here:
            return self.fallback()._launch(q, k, v, out, lse, descales, compile_only, cu_seqlens, alibi, dropout)
        kernel, args, options = self.prepared(q, k, self.staged_v(v), out, lse, descales, cu_seqlens, alibi, dropout)
        if compile_only:
            direct.warmup(kernel, self.grid, args, options)
        else:
            direct.launch(self._direct, "attn_fwd", kernel, self.grid, args, options)

    def _load(self) -> None:
        if not self.params.gluon and interpreting():
            compat.patch_interpreter()
        module = load_module(self.spec, self.params)
        # bound first: another thread's first call may see the module set
        self.bound = bound(self.spec, self.kernel, module, self.fixed, bool(self.params.gluon))
        self.module = module

    def prepared(self, q, k, v, out, lse, descales=None, cu_seqlens=None, alibi=None, dropout=None):
        """(kernel, arguments, keyword options) of this launch on tensors it can take (fp8: V
        as ``staged_v`` gives it), so that ``kernel[self.grid](*arguments, **options)`` runs it;
        benchmarks/overhead.py times that bare launch. fp8 ``descales`` None: all 1."""
        if self.module is None:
            self._load()
        if self.grid is None:  # persistent, first run: as many programs as the SMs hold
            self.grid = (min(self.tiles, self.params.persistent * _sm_count(q.device)),)
        given = {"Q": q, "K": k, "V": v, "O": out, "LSE": lse}
        if cu_seqlens is not None:
            given["CU_Q"], given["CU_K"] = cu_seqlens
        if alibi is not None:
            given["ALIBI"], given["stride_ab"] = alibi
        if dropout is not None:
            given["SEED"], given["dropout_p"] = dropout
        if self.spec.fp8:
            if descales is None:
                descales = check_descales(self.problem, q.device, None, None, None)
            for t, (factor, stride_b, stride_h) in zip("qkv", descales):
                given[f"DESCALE_{t.upper()}"] = factor
                given[f"stride_ds{t}_b"], given[f"stride_ds{t}_h"] = stride_b, stride_h
        if self._queue:
            given["TILES"] = zero_counters(q.device, 2)
        if self.params.loads == "tma_device" and q.is_cuda:
            ensure_allocator()
        fn, binding, options = self.bound
        return fn, binding(given), options


def forward(
    q,
    k,
    v,
    problem: Problem,
    params: TuningParams,
    *,
    out=None,
    lse=None,
    compile_only: bool = False,
    launch: Launch | None = None,
    descales=None,
    alibi=None,
    dropout=None,
):
    """Run the forward kernel for ``problem`` with ``params``; returns (out, lse fp32).

    ``out``/``lse`` may be given preallocated (tests poison them with NaN first).
    ``compile_only`` compiles the exact specialisation this call would launch, without
    launching it (the tuner's compile workers). ``launch``: a ``Launch`` built earlier
    for this problem and these params (``attention()`` keeps one per call shape).
    ``descales``: fp8 inputs' factors as ``fp8.check_descales`` returns them (None: all 1).
    ``alibi``: ALiBi's (slopes, batch stride) as ``problem.check_alibi`` returns them.
    ``dropout``: (seed, dropout_p) as ``runtime.dropout`` gives them.
    """
    fp8 = problem.kernel_spec().fp8
    if fp8 and descales is None:
        descales = check_descales(problem, q.device, None, None, None)
    if out is None:
        out = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device) if fp8 else torch.empty_like(q)
    if lse is None:
        lse = torch.empty((problem.batch, problem.heads_q, problem.seqlen_q), device=q.device, dtype=torch.float32)
    if problem.batch == 0:
        return out, lse
    (launch or Launch(problem, params)).run(
        q, k, v, out, lse, descales=descales, alibi=alibi, dropout=dropout, compile_only=compile_only
    )
    return out, lse
