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
    effective_params,
    gluon_descriptor,
    host_descriptor,
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
    compile_only: bool = False,
):
    """Gradients (dq, dk, dv) of ``problem``'s attention for the output gradient ``dout``.

    ``out`` and ``lse`` are what the forward returned for the same inputs. ``dout`` may have
    any strides; a last dim that is not contiguous is copied first. ``dq``/``dk``/``dv`` may
    be given preallocated (tests poison them with NaN). With ``params.dq_mode`` "separate"
    there are no atomics: every sum has one owner and a fixed order, so repeated calls give
    bit-identical gradients; "atomic" adds dQ in fp32 in no fixed order. ``compile_only``
    compiles this call's kernels without launching them (the tuner's workers). A caller that
    repeats a call shape keeps a ``BackwardLaunch`` instead (attention() does).
    """
    return BackwardLaunch(problem, params).run(q, k, v, out, lse, dout, dq=dq, dk=dk, dv=dv, compile_only=compile_only)


class BackwardLaunch:
    """What a backward call needs that depends on the problem and the params, not on where
    the tensors live: built once per call shape and reused, so that a call pays for its
    allocations, descriptors and launches only (short cells are bound by host time)."""

    __slots__ = (
        "problem",
        "params",
        "spec",
        "gluon",
        "descriptors",
        "atomic",
        "dq_add",
        "ds_matmul",
        "ds_chunks",
        "modules",
        "scalars",
        "kernels",
        "rows",
        "grids",
        "layouts",
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
        # every kernel the variant runs, by name, with its constexprs, launch options (a Gluon
        # kernel's: its module's LAUNCH) and descriptor boxes
        self.kernels = {kernel.name: kernel for _, kernel in plan(spec, params)}
        self.params = params = triton_part(params) if params.gluon else params
        self.descriptors = params.loads == "tma_host"
        self.atomic = params.dq_mode != "separate"
        self.modules = None  # loaded on the first run: the interpreter check happens there
        self._fallback = None
        # dK/dV's grid has a program per k/v head; dQ's (gluon=2) one per query head
        gluon = self.gluon.gluon if self.gluon is not None else 0
        heads = problem.heads_q if gluon == 2 else problem.heads_kv
        self._gluon_devices = GluonDevices(problem, heads=heads) if gluon else None
        self._direct = {}  # the kernels' launchers, kept by runtime.direct
        b, hq, hkv, nq, nk = problem.batch, problem.heads_q, problem.heads_kv, problem.seqlen_q, problem.seqlen_k
        left, right = window_extents(problem)
        self.scalars = (problem.sm_scale, problem.softcap, left, right)
        self.rows = rows = self.kernels["attn_bwd_delta"].constexprs["BLOCK"]
        outer = params.block_m
        self.grids = dict(
            delta=(-(-nq // rows) * b * hq,),
            dkdv=(-(-nk // outer) * b * hkv,),
            dq=(-(-nq // outer) * b * hq,),
            gluon_dkdv=(-(-nk // outer), b * hkv),
            gluon_dq=(-(-nq // outer), b * hq),
        )
        # Each Gluon kernel's (box, layout) per descriptor argument, in argument order. Layouts
        # are part of a Gluon descriptor's type: built once here, not per call.
        self.layouts = {}
        if self.gluon is not None:
            from ..generator.gluon import descriptor_dtype, descriptor_layout

            for kernel in self.kernels.values():
                if kernel.options is None:  # (a Gluon kernel)
                    self.layouts[kernel.name] = {
                        n: (list(box), descriptor_layout(box, descriptor_dtype(spec, n)))
                        for n, box in kernel.boxes.items()
                    }

    def _dkdv_ds_matmul(self, run, module, bs: slice, hs: slice, q, k, v, dout, lse, delta, dq, dk, dv) -> None:
        """One chunk of dq_mode matmul: batches ``bs``, k/v heads ``hs``. The Gluon dK/dV kernel
        writes dK, dV and sm_scale * dS^T into a (B, Hq, Nk, Nq) scratch, then the module's
        attn_bwd_dq_ds computes dQ = dS K from it, DS_ROWS queries a program (its DST box's
        columns)."""
        problem = self.problem
        g, nq, nk = problem.group, problem.seqlen_q, problem.seqlen_k
        qs = slice(hs.start * g, hs.stop * g)  # the chunk's query heads
        nb, nh = bs.stop - bs.start, hs.stop - hs.start
        # Rows 16-byte aligned for the descriptor. Under a causal mask the dK/dV kernel skips the
        # tiles before each key block's first query block, and stores zeros into those of them
        # that share a dQ program's DS_ROWS queries with that block (BAND): dQ's kernel reads
        # each key block its last query sees, over all of its queries.
        scratch = torch.empty((nb, nh * g, nk, -(-nq // 8) * 8), dtype=q.dtype, device=q.device)[..., :nq]
        tensors = dict(
            Q=q[bs, qs], K=k[bs, hs], V=v[bs, hs], DO=dout[bs, qs], DK=dk[bs, hs], DV=dv[bs, hs], DST=scratch
        )
        # (LSE and delta are contiguous (B, Hq, Nq): a chunk of whole batches, or heads of one,
        # is contiguous too, as the kernel's offsets assume.)
        descs = self._gluon_descriptors("attn_bwd_dkdv", tensors)
        args = descs.values()
        grid = (-(-nk // self.gluon.block_m), nb * nh)
        (ds_box, ds_layout), (k_box, k_layout) = self.layouts["attn_bwd_dq_ds"].values()
        ds_rows = ds_box[3]
        # (K's box is the dK/dV kernel's: its descriptor serves both)
        k_desc = descs["K"] if k_box == self.layouts["attn_bwd_dkdv"]["K"][0] else None
        run(
            module,
            "attn_bwd_dkdv",
            grid,
            *args,
            lse[bs, qs],
            delta[bs, qs],
            nh,
            g,
            nq,
            nk,
            problem.sm_scale,
            ds_rows,  # BAND
            key=("attn_bwd_dkdv", grid),
        )
        rows = dq[bs, qs]
        grid = (-(-nq // ds_rows), nb * nh * g)
        run(
            module,
            "attn_bwd_dq_ds",
            grid,
            gluon_descriptor(scratch, ds_box, ds_layout),
            k_desc or gluon_descriptor(tensors["K"], k_box, k_layout),
            rows,
            *rows.stride()[:3],
            nh * g,
            g,
            nq,
            nk,
            key=("attn_bwd_dq_ds", grid),
        )

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
            return self._gluon_devices(q.device) and tma_compatible(*read)
        return self.params.loads not in TMA_LOADS or tma_compatible(q, k, v, dout, dq, dk, dv)

    def _load(self):
        if self.modules is None:
            if interpreting():
                compat.patch_interpreter()
            modules = (load_module(self.spec, self.params),)
            if self.gluon is not None:
                modules += (load_module(self.spec, self.gluon),)
            self.modules = modules
        return self.modules

    def run(self, q, k, v, out, lse, dout, *, dq=None, dk=None, dv=None, compile_only: bool = False):
        """The gradients (dq, dk, dv); arguments as ``backward``'s."""
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
        return self._launch(q, k, v, out, lse, dout, dq, dk, dv, compile_only)

    def _gluon_descriptors(self, kernel: str, tensors: dict) -> dict:
        """A Gluon kernel's descriptors over ``tensors``, by argument, in argument order."""
        return {n: gluon_descriptor(tensors[n], box, layout) for n, (box, layout) in self.layouts[kernel].items()}

    def _launch(self, q, k, v, out, lse, dout, dq, dk, dv, compile_only: bool):
        if not self._runs_here(q, k, v, dout, dq, dk, dv):
            return self.fallback()._launch(q, k, v, out, lse, dout, dq, dk, dv, compile_only)
        modules = self._load()
        module = modules[0]
        problem, params, grids, kernels = self.problem, self.params, self.grids, self.kernels
        b, hq, hkv, nq, nk = problem.batch, problem.heads_q, problem.heads_kv, problem.seqlen_q, problem.seqlen_k
        lse = lse.contiguous()
        delta = torch.empty((b, hq, nq), device=q.device, dtype=torch.float32)

        def run(module, name, grid, *args, key=None):
            # constexprs and launch options as the kernel's descriptor gives them (a Gluon
            # kernel's options: its module's LAUNCH)
            fn, kernel = getattr(module, name), kernels[name]
            options = {**kernel.constexprs, **(module.LAUNCH if kernel.options is None else kernel.options)}
            if compile_only:
                direct.warmup(fn, grid, args, options)
            else:  # (a kept launcher keeps its grid: ``key`` names one per grid where it varies)
                direct.launch(self._direct, key or name, fn, grid, args, options)

        run(module, "attn_bwd_delta", grids["delta"], out, dout, delta, *out.stride()[:3], *dout.stride()[:3], hq, nq)
        if self.atomic:  # fp32 sums of dQ, (B, Hq, Nq, D) contiguous, filled by the dK/dV kernel
            dq_acc = torch.zeros((b, hq, nq, problem.head_dim), device=q.device, dtype=torch.float32)
        if self.gluon is not None:  # its descriptors carry a layout (part of a Gluon kernel's type)
            gluon_module = modules[1]
            if self.ds_matmul:
                # (compiling only: the first chunk's launches are the call's specialisation)
                for bs, hs in self.ds_chunks[: 1 if compile_only else None]:
                    self._dkdv_ds_matmul(run, gluon_module, bs, hs, q, k, v, dout, lse, delta, dq, dk, dv)
                return dq, dk, dv
            tensors = dict(Q=q, K=k, V=v, DO=dout, DK=dk, DV=dv, DQ=dq)
            if self.dq_add:
                tensors["DQACC"] = dq_acc
            descs = self._gluon_descriptors("attn_bwd_dkdv", tensors).values()
            run(
                gluon_module,
                "attn_bwd_dkdv",
                grids["gluon_dkdv"],
                *descs,
                lse,
                delta,
                hkv,
                problem.group,
                nq,
                nk,
                problem.sm_scale,
            )
            if self.gluon.gluon == 2:
                descs = self._gluon_descriptors("attn_bwd_dq", tensors).values()
                run(
                    gluon_module,
                    "attn_bwd_dq",
                    grids["gluon_dq"],
                    *descs,
                    lse,
                    delta,
                    hq,
                    problem.group,
                    nq,
                    nk,
                    problem.sm_scale,
                )
                return dq, dk, dv
        else:
            boxes = kernels["attn_bwd_dkdv"].boxes

            def tile(t, name):  # (loads=tma_host: a host descriptor of the kernel's box)
                return host_descriptor(t, *boxes[name][2:]) if self.descriptors else t

            dkdv_args = (
                tile(q, "Q"),
                tile(k, "K"),
                tile(v, "V"),
                tile(dout, "DO"),
                lse,
                delta,
                tile(dk, "DK"),
                tile(dv, "DV"),
            )
            if self.atomic:
                dkdv_args += (tile(dq_acc, "DQACC") if params.dq_mode == "tma_reduce" else dq_acc,)
            run(
                module,
                "attn_bwd_dkdv",
                grids["dkdv"],
                *dkdv_args,
                *q.stride()[:3],
                *k.stride()[:3],
                *v.stride()[:3],
                *dout.stride()[:3],
                *dk.stride()[:3],
                *dv.stride()[:3],
                hkv,
                problem.group,
                nq,
                nk,
                *self.scalars,
            )
        if self.atomic:
            run(module, "attn_bwd_dq_store", grids["delta"], dq_acc, dq, *dq.stride()[:3], hq, nq, problem.sm_scale)
            return dq, dk, dv
        boxes = kernels["attn_bwd_dq"].boxes

        def tile(t, name):
            return host_descriptor(t, *boxes[name][2:]) if self.descriptors else t

        run(
            module,
            "attn_bwd_dq",
            grids["dq"],
            tile(q, "Q"),
            tile(k, "K"),
            tile(v, "V"),
            tile(dout, "DO"),
            lse,
            delta,
            tile(dq, "DQ"),
            *q.stride()[:3],
            *k.stride()[:3],
            *v.stride()[:3],
            *dout.stride()[:3],
            *dq.stride()[:3],
            hq,
            problem.group,
            nq,
            nk,
            *self.scalars,
        )
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
