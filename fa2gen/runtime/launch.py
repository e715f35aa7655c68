"""Launch one generated forward variant on validated tensors."""

from __future__ import annotations

import torch

from ..generator.cache import interpreting, load_module
from ..generator.spec import TMA_LOADS, TuningParams
from .interpreter import patch_interpreter
from .problem import Problem

_ALIGN = 16  # bytes: tensor descriptors need 16-byte aligned bases and strides


def tma_compatible(*tensors: torch.Tensor) -> bool:
    """Whether every tensor can be addressed by a tensor descriptor."""
    for t in tensors:
        size = t.element_size()
        if t.data_ptr() % _ALIGN:
            return False
        for s in t.stride()[:-1]:
            if s <= 0 or (s * size) % _ALIGN:
                return False
    return True


def _scratch(size: int, alignment: int, stream) -> torch.Tensor:
    # In-kernel descriptors live in a per-launch global scratch buffer (128 B each).
    return torch.empty(size, dtype=torch.int8, device="cuda")


def ensure_allocator() -> None:
    """Give Triton an allocator for in-kernel descriptors, unless the caller set one.

    Triton keeps the allocator in a context variable that starts as a null allocator
    in every thread, so the check runs per launch (a context-variable read).
    """
    import triton
    from triton.runtime import _allocation

    if _allocation._allocator.get() is _allocation._NULL_ALLOCATOR:
        triton.set_allocator(_scratch)


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


def host_descriptor(t: torch.Tensor, rows: int, head_dim_padded: int):
    """A host tensor descriptor over a whole (B, H, N, D) tensor with (rows x head_dim_padded)
    blocks: rows past N and columns past D read as zero and are not written."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, head_dim_padded])


def window_extents(problem: Problem) -> tuple[int, int]:
    """The (left, right) window as the kernels take it. Unbounded (or larger-than-the-problem)
    extents become a distance no row can exceed; clamping also keeps the kernels' 32-bit
    bound arithmetic from overflowing."""
    unbounded = problem.seqlen_q + problem.seqlen_k
    left = unbounded if problem.window_left < 0 else min(problem.window_left, unbounded)
    right = unbounded if problem.window_right < 0 else min(problem.window_right, unbounded)
    return left, right


class Launch:
    """What one launch needs that depends on the problem and the params, not on where
    the tensors live: built once per call shape by ``attention()`` and reused."""

    __slots__ = ("problem", "params", "spec", "module", "grid", "scalars", "constexprs", "rows", "_fallback")

    def __init__(self, problem: Problem, params: TuningParams):
        self.problem = problem
        self.params = params
        self.spec = spec = problem.kernel_spec()
        self.module = None  # loaded on first run: the interpreter check happens there
        dp = spec.head_dim_padded
        left, right = window_extents(problem)
        # In the kernel's argument order: Hq, group, Nq, Nk, sm_scale, softcap, win_left, win_right.
        self.scalars = (
            problem.heads_q, problem.group, problem.seqlen_q, problem.seqlen_k,
            problem.sm_scale, problem.softcap, left, right,
        )
        self.grid = (-(-problem.seqlen_q // params.block_m) * problem.batch * problem.heads_q,)
        self.constexprs = dict(
            HEAD_DIM=problem.head_dim,
            HEAD_DIM_PAD=dp,
            BLOCK_M=params.block_m,
            BLOCK_N=params.block_n,
            num_warps=params.num_warps,
            num_stages=params.num_stages,
        )
        # Descriptor block rows of q, k, v and out.
        self.rows = (params.block_m, params.block_n, params.block_n, params.block_m)
        self._fallback = None

    def fallback(self) -> "Launch":
        """The same launch with pointer loads, for tensors descriptors cannot address."""
        if self._fallback is None:
            self._fallback = Launch(self.problem, effective_params(self.spec, self.params))
        return self._fallback

    def run(self, q, k, v, out, lse, *, compile_only: bool = False) -> None:
        if self.params.loads in TMA_LOADS and not tma_compatible(q, k, v, out):
            return self.fallback().run(q, k, v, out, lse, compile_only=compile_only)
        if self.module is None:
            if interpreting():
                patch_interpreter()
            self.module = load_module(self.spec, self.params)
        kernel = self.module.attn_fwd
        if self.params.loads == "tma_host":
            dp = self.spec.head_dim_padded
            args = [host_descriptor(t, r, dp) for t, r in zip((q, k, v, out), self.rows)]
            args.append(lse)
        else:
            if self.params.loads == "tma_device" and q.device.type == "cuda":
                ensure_allocator()
            args = [q, k, v, out, lse, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3]]
        if compile_only:
            kernel.warmup(*args, *self.scalars, grid=self.grid, **self.constexprs)
        else:
            kernel[self.grid](*args, *self.scalars, **self.constexprs)


def forward(q, k, v, problem: Problem, params: TuningParams, *, out=None, lse=None, compile_only: bool = False,
            launch: Launch | None = None):
    """Run the forward kernel for ``problem`` with ``params``; returns (out, lse fp32).

    ``out``/``lse`` may be given preallocated (tests poison them with NaN first).
    ``compile_only`` compiles the exact specialisation this call would launch, without
    launching it (the tuner's compile workers). ``launch``: a ``Launch`` built earlier
    for this problem and these params (``attention()`` keeps one per call shape).
    """
    if out is None:
        out = torch.empty_like(q)
    if lse is None:
        lse = torch.empty((problem.batch, problem.heads_q, problem.seqlen_q), device=q.device, dtype=torch.float32)
    if problem.batch == 0:
        return out, lse
    (launch or Launch(problem, params)).run(q, k, v, out, lse, compile_only=compile_only)
    return out, lse
