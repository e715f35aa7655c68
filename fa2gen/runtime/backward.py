"""Launch the generated backward kernels: delta, then dK/dV and dQ (its own kernel, atomics
from the dK/dV kernel and a store, or a matmul kernel over the dS the Gluon dK/dV kernel
stores)."""

from __future__ import annotations

import torch

from .. import compat
from ..generator.cache import interpreting, load_module
from ..generator.descriptors import plan
from ..generator.spec import TMA_LOADS, TuningParams, triton_part
from . import direct
from .launch import (
    GRID_Y_MAX,
    GluonDevices,
    bound,
    effective_params,
    ensure_allocator,
    tma_compatible,
    window_extents,
)
from .problem import Problem, _check_tensor

# dq_mode "matmul": the most bytes of dS scratch a backward holds at once. Its chunks take
# whole batch elements where they fit, else heads of one batch element.
DS_SCRATCH_BYTES = 2 << 30


def backward(
    q,
    k,
    v,
    out,
    lse,
    dout,
    problem: Problem,
    params: TuningParams,
    *,
    dq=None,
    dk=None,
    dv=None,
    alibi=None,
    dropout=None,
    compile_only: bool = False,
):
    """Gradients (dq, dk, dv) of ``problem``'s attention for the output gradient ``dout``.

    ``out`` and ``lse`` are what the forward returned for the same inputs. ``dout`` may have
    any strides; a last dim that is not contiguous is copied first. ``dq``/``dk``/``dv`` may
    be given preallocated (tests poison them with NaN). With ``params.dq_mode`` "separate"
    there are no atomics: every sum has one owner and a fixed order, so repeated calls give
    bit-identical gradients; "atomic" adds dQ in fp32 in no fixed order. ``compile_only``
    compiles this call's kernels without launching them (the tuner's workers). A caller that
    repeats a call shape keeps a ``BackwardLaunch`` instead (attention() does). ``alibi``:
    ALiBi's (slopes, batch stride), as the forward took them; ``dropout``: the forward's
    (seed, dropout_p).
    """
    return BackwardLaunch(problem, params).run(
        q, k, v, out, lse, dout, dq=dq, dk=dk, dv=dv, alibi=alibi, dropout=dropout, compile_only=compile_only
    )


class BackwardLaunch:
    """What a backward call needs that depends on the problem and the params, not on where
    the tensors live: built once per call shape and reused, so that a call pays for its
    allocations, descriptors and launches only (short cells are bound by host time)."""

    __slots__ = (
        "problem",
        "params",
        "spec",
        "gluon",
        "atomic",
        "dq_add",
        "ds_matmul",
        "ds_chunks",
        "fixed",
        "plan",
        "kernels",
        "launches",
        "grids",
        "_fallback",
        "_gluon_devices",
        "_direct",
    )

    def __init__(self, problem: Problem, params: TuningParams):
        self.problem = problem
        self.spec = spec = problem.kernel_spec("bwd")
        # gluon=1: the dK/dV kernel in Gluon where it can run (gluon=2: and the dQ kernel;
        # dq_mode matmul: dQ by a matmul over its dS instead; dq_mode atomic: the one pass,
        # which computes dQ and adds it into fp32 sums); the rest from the Triton template on
        # the same tiles (``params`` holds those, and is the fallback's).
        # dq_mode matmul needs a k/v head's dS within the scratch bound (a chunk holds at least
        # one), and its query heads within a grid's rows (dQ's kernel takes a row per query
        # head): else it runs as dq_mode separate
        if params.dq_mode == "matmul" and (ds_head_bytes(problem) > DS_SCRATCH_BYTES or problem.group > GRID_Y_MAX):
            params = params.replace(dq_mode="separate")
        self.gluon = params if params.gluon else None
        self.ds_matmul = params.dq_mode == "matmul"
        self.ds_chunks = ds_chunks(problem, DS_SCRATCH_BYTES) if self.ds_matmul else []
        # (gluon=1, dq_mode atomic: the Gluon dK/dV kernel adds dQ; the Triton module's store
        # pass scales and casts the sums)
        self.dq_add = params.gluon == 1 and params.dq_mode == "atomic"
        # every kernel the variant runs, with the params of its module, and by name: its
        # arguments, constexprs, launch options (a Gluon kernel's: its module's LAUNCH) and boxes
        self.plan = plan(spec, params)
        self.kernels = {kernel.name: kernel for _, kernel in self.plan}
        self.params = params = triton_part(params) if params.gluon else params
        self.atomic = params.dq_mode != "separate"
        self.launches = None  # on the first run: the interpreter check happens there
        self._fallback = None
        # dK/dV's grid has a program per k/v head; dQ's (gluon=2) one per query head
        gluon = self.gluon.gluon if self.gluon is not None else 0
        heads = problem.heads_q if gluon == 2 else problem.heads_kv
        self._gluon_devices = GluonDevices(problem, heads=heads) if gluon else None
        self._direct = {}  # the kernels' launchers, kept by runtime.direct
        b, hq, hkv, nq, nk = problem.batch, problem.heads_q, problem.heads_kv, problem.seqlen_q, problem.seqlen_k
        left, right = window_extents(problem)
        self.fixed = dict(
            Hq=hq,
            Hkv=hkv,
            group=problem.group,
            Nq=nq,
            Nk=nk,
            sm_scale=problem.sm_scale,
            softcap=problem.softcap,
            win_left=left,
            win_right=right,
            Tq=problem.total_q,
        )
        if self.ds_matmul:
            # Under a causal mask the dK/dV kernel zeroes the skipped tiles within the band of
            # queries one dQ program reads: its DST box's columns
            self.fixed["BAND"] = self.kernels["attn_bwd_dq_ds"].boxes["DST"][3]
        rows = self.kernels["attn_bwd_delta"].constexprs["BLOCK"]
        outer = params.block_m
        self.grids = dict(
            delta=(-(-nq // rows) * b * hq,),
            # a packed batch's dQ sums are one run of its packed rows per query head
            dq_store=(-(-problem.total_q // rows) * hq,) if problem.varlen else (-(-nq // rows) * b * hq,),
            dkdv=(-(-nk // outer) * b * hkv,),
            dq=(-(-nq // outer) * b * hq,),
            gluon_dkdv=(-(-nk // outer), b * hkv),
            gluon_dq=(-(-nq // outer), b * hq),
        )

    def _dkdv_ds_matmul(self, run, given: dict, bs: slice, hs: slice) -> None:
        """One chunk of dq_mode matmul: batches ``bs``, k/v heads ``hs``. The Gluon dK/dV kernel
        writes dK, dV and sm_scale * dS^T into a (B, Hq, Nk, Nq) scratch, then the module's
        attn_bwd_dq_ds computes dQ = dS K from it, BAND queries a program."""
        problem = self.problem
        g, nq, nk = problem.group, problem.seqlen_q, problem.seqlen_k
        qs = slice(hs.start * g, hs.stop * g)  # the chunk's query heads
        nb, nh = bs.stop - bs.start, hs.stop - hs.start
        q = given["Q"]
        # Rows 16-byte aligned for the descriptor. Under a causal mask the dK/dV kernel skips the
        # tiles before each key block's first query block, and stores zeros into those of them
        # that share a dQ program's queries with that block (BAND): dQ's kernel reads each key
        # block its last query sees, over all of its queries.
        scratch = torch.empty((nb, nh * g, nk, -(-nq // 8) * 8), dtype=q.dtype, device=q.device)[..., :nq]
        # (LSE and delta are contiguous (B, Hq, Nq): a chunk of whole batches, or heads of one,
        # is contiguous too, as the kernel's offsets assume.)
        chunk = {n: given[n][bs, qs] for n in ("Q", "DO", "LSE", "DELTA")}
        chunk.update({n: given[n][bs, hs] for n in ("K", "V", "DK", "DV")})
        chunk.update(DST=scratch, DQ_PTR=given["DQ"][bs, qs], Hkv=nh, Hq=nh * g)
        grid = (-(-nk // self.gluon.block_m), nb * nh)
        run("attn_bwd_dkdv", grid, chunk, key=("attn_bwd_dkdv", grid))
        grid = (-(-nq // self.fixed["BAND"]), nb * nh * g)
        run("attn_bwd_dq_ds", grid, chunk, key=("attn_bwd_dq_ds", grid))

    def fallback(self) -> "BackwardLaunch":
        """The launch to run where this one cannot: the Triton dK/dV kernel where the Gluon
        one cannot run; pointer loads for tensors descriptors cannot address."""
        if self._fallback is None:
            if self.gluon is not None:
                params = self.params
            else:  # (dQ's bulk reduction goes through a descriptor too: atomics instead)
                params = effective_params(self.spec, self.params)
            self._fallback = BackwardLaunch(self.problem, params)
        return self._fallback

    def _runs_here(self, q, k, v, dout, dq, dk, dv) -> bool:
        if self.gluon is not None:  # (dq_mode matmul's dQ kernel, and the one pass's store of its
            # sums, write dQ through pointers)
            read = (q, k, v, dout, dk, dv) if self.ds_matmul or self.dq_add else (q, k, v, dout, dq, dk, dv)
            if self.problem.varlen:  # (descriptors built per sequence: a packed tensor has a first row)
                in_kernel = q.shape[2] > 0 and k.shape[2] > 0
                return in_kernel and self._gluon_devices(q.device) and tma_compatible(*read, in_kernel=True)
            return self._gluon_devices(q.device) and tma_compatible(*read)
        return self.params.loads not in TMA_LOADS or tma_compatible(q, k, v, dout, dq, dk, dv)

    def _load(self) -> dict:
        """Each kernel's (function, argument binding, options) by name, on the first run."""
        if self.launches is None:
            if interpreting():
                compat.patch_interpreter()
            modules = (load_module(self.spec, self.params),)
            if self.gluon is not None:
                modules += (load_module(self.spec, self.gluon),)
            launches = {}
            # (dq_mode matmul's Gluon kernels run a chunk at a time: the chunk gives the heads)
            chunked = {k: v for k, v in self.fixed.items() if k not in ("Hq", "Hkv")}
            for module_params, kernel in self.plan:
                gluon = bool(module_params.gluon)
                fixed = chunked if gluon and self.ds_matmul else self.fixed
                launches[kernel.name] = bound(self.spec, kernel, modules[gluon], fixed, gluon)
            self.launches = launches
        return self.launches

    def run(
        self,
        q,
        k,
        v,
        out,
        lse,
        dout,
        *,
        dq=None,
        dk=None,
        dv=None,
        cu_seqlens=None,
        alibi=None,
        dropout=None,
        compile_only: bool = False,
    ):
        """The gradients (dq, dk, dv); arguments as ``backward``'s. ``cu_seqlens``: a packed
        batch's (cu_seqlens_q, cu_seqlens_k), with the tensors as ``runtime.varlen.batch_view``
        gives them and lse (Hq, total_q). ``alibi``: ALiBi's (slopes, batch stride); ``dropout``:
        the forward's (seed, dropout_p)."""
        if dout.shape != out.shape:
            raise ValueError(f"grad_output must have the output's shape {tuple(out.shape)}, got {tuple(dout.shape)}")
        if dout.dtype != out.dtype:
            dout = dout.to(out.dtype)
        if dout.stride(-1) != 1:
            dout = dout.contiguous()
        if dq is not None or dk is not None or dv is not None:  # (preallocated: the tests, the tuner)
            for name, given, like in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
                if given is not None:
                    _check_gradient_buffer(name, given, like)
        dq = torch.empty_like(q) if dq is None else dq
        dk = torch.empty_like(k) if dk is None else dk
        dv = torch.empty_like(v) if dv is None else dv
        if self.problem.batch == 0:
            return dq, dk, dv
        return self._launch(q, k, v, out, lse, dout, dq, dk, dv, compile_only, cu_seqlens, alibi, dropout)

    def _launch(
        self, q, k, v, out, lse, dout, dq, dk, dv, compile_only: bool, cu_seqlens=None, alibi=None, dropout=None
    ):
        if not self._runs_here(q, k, v, dout, dq, dk, dv):
            args = (q, k, v, out, lse, dout, dq, dk, dv, compile_only, cu_seqlens, alibi, dropout)
            return self.fallback()._launch(*args)
        launches, grids = self._load(), self.grids
        if self.gluon is not None and self.problem.varlen and q.is_cuda:  # (in-kernel descriptors' scratch)
            ensure_allocator()
        delta = torch.empty(lse.shape, device=q.device, dtype=torch.float32)  # (one per row of LSE)
        given = dict(Q=q, K=k, V=v, O=out, DO=dout, LSE=lse.contiguous(), DELTA=delta, DQ=dq, DK=dk, DV=dv)
        if cu_seqlens is not None:
            given["CU_Q"], given["CU_K"] = cu_seqlens
        if alibi is not None:
            given["ALIBI"], given["stride_ab"] = alibi
        if dropout is not None:
            given["SEED"], given["dropout_p"] = dropout

        def run(name, grid, given, key=None):
            fn, binding, options = launches[name]
            args = binding(given)
            if compile_only:
                direct.warmup(fn, grid, args, options)
            else:  # (a kept launcher keeps its grid: ``key`` names one per grid where it varies)
                direct.launch(self._direct, key or name, fn, grid, args, options)

        run("attn_bwd_delta", grids["delta"], given)
        if self.atomic:  # fp32 sums of dQ, (B, Hq, Nq, D) contiguous, filled by the dK/dV kernel
            # (a packed batch's: (Hq, Tq, D), its query rows as they are packed)
            sums = q.shape[1:] if self.problem.varlen else q.shape
            given["DQACC"] = torch.zeros(sums, device=q.device, dtype=torch.float32)
        if self.gluon is not None:
            if self.ds_matmul:
                # (compiling only: the first chunk's launches are the call's specialisation)
                for bs, hs in self.ds_chunks[: 1 if compile_only else None]:
                    self._dkdv_ds_matmul(run, given, bs, hs)
                return dq, dk, dv
            run("attn_bwd_dkdv", grids["gluon_dkdv"], given)
            if self.gluon.gluon == 2:
                run("attn_bwd_dq", grids["gluon_dq"], given)
                return dq, dk, dv
        else:
            run("attn_bwd_dkdv", grids["dkdv"], given)
        if self.atomic:
            run("attn_bwd_dq_store", grids["dq_store"], given)
        else:
            run("attn_bwd_dq", grids["dq"], given)
        return dq, dk, dv


def _check_gradient_buffer(name: str, given, like) -> None:
    # A preallocated gradient is written in place by every path, the kernels' pointer stores
    # included: it must look like the input it is the gradient of, last dim contiguous (the
    # inputs' own check).
    if not isinstance(given, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(given).__name__}")
    _check_tensor(name, given)
    if given.shape != like.shape or given.dtype != like.dtype or given.device != like.device:
        raise ValueError(
            f"{name} must have its input's shape {tuple(like.shape)}, dtype {like.dtype} and device "
            f"{like.device}, got {tuple(given.shape)}, {given.dtype} on {given.device}"
        )


def ds_head_bytes(problem: Problem) -> int:
    """dq_mode matmul's dS scratch for one k/v head: 2 bytes per query-key pair of its query
    heads, rows padded to 8 queries."""
    return 2 * problem.group * problem.seqlen_k * (-(-problem.seqlen_q // 8) * 8)


def ds_chunks(problem: Problem, limit: int) -> list[tuple[slice, slice]]:
    """dq_mode matmul's chunks, as (batches, k/v heads) slices, each holding at most ``limit``
    bytes of dS scratch, or one k/v head, and at most GRID_Y_MAX query heads in all (dQ's
    kernel takes a program row per query head of its chunk)."""
    b, hkv = problem.batch, problem.heads_kv
    heads = max(1, min(limit // ds_head_bytes(problem), GRID_Y_MAX // problem.group))
    if heads >= hkv:
        step = heads // hkv
        return [(slice(i, min(i + step, b)), slice(0, hkv)) for i in range(0, b, step)]
    return [(slice(i, i + 1), slice(j, min(j + heads, hkv))) for i in range(b) for j in range(0, hkv, heads)]
