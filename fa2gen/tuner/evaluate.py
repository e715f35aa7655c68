"""Turning a candidate into a measurement: compile, gate on correctness, time.

``GpuEvaluator`` does it for real on the local GPU. ``CostModelEvaluator`` is the
named test seam: a documented cost function standing in for GPU timing, so the
tuner's orchestration (Optuna, pruning, resume, storage) runs in CPU tests.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import multiprocessing
import os
import time
from typing import Protocol

from ..generator.spec import TuningParams
from ..runtime.problem import Problem
from ..store.buckets import Bucket
from ..store.records import Measurement


class Rejected(Exception):
    """A candidate that must not be stored: failed to compile, ran out of resources,
    or computed a wrong answer. ``reason`` goes into the trial's user attrs; ``fatal``
    means the device is unusable afterwards (a CUDA fault), so tuning must stop."""

    def __init__(self, reason: str, *, fatal: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.fatal = fatal


class DeviceFault(RuntimeError):
    """A candidate broke the CUDA context; the tuning run stops (restart the process)."""


def _is_cuda_fault(e: BaseException) -> bool:
    text = str(e)
    return "CUDA error" in text or "illegal memory access" in text or "unspecified launch failure" in text


def representative_problem(bucket: Bucket) -> Problem:
    """The problem a bucket is timed on: its upper edge, at most 32 query heads (decode: full
    caches of the bucket's key length, no new keys; a packed batch: ``varlen_lengths``)."""
    hq = max(bucket.group, min(bucket.batch_heads, 32))
    kw = _semantics(bucket)
    batch = max(1, bucket.batch_heads // hq)
    return Problem(
        batch=batch,
        heads_q=hq,
        heads_kv=hq // bucket.group,
        seqlen_q=bucket.seqlen_q,
        seqlen_k=bucket.seqlen_k,
        head_dim=bucket.head_dim,
        dtype=bucket.dtype,
        mask=bucket.mask,
        window_left=kw.get("window_size", (-1, -1))[0],
        window_right=0 if bucket.mask != "none" else -1,
        sm_scale=bucket.head_dim**-0.5,
        softcap=kw["softcap"],
        page_size=bucket.page,
        varlen=bucket.varlen,
        total_q=sum(varlen_lengths(bucket)) if bucket.varlen else 0,
    )


def varlen_lengths(bucket: Bucket) -> list[int]:
    """A packed bucket's sequence lengths, as timed: its batch of sequences spread evenly up to
    the bucket's length (longest last), so that the kernel meets short and long sequences
    together, as packed training batches hold them."""
    hq = max(bucket.group, min(bucket.batch_heads, 32))
    batch = max(1, bucket.batch_heads // hq)
    return [max(1, (i + 1) * bucket.seqlen_q // batch) for i in range(batch)]


def flops(bucket: Bucket) -> float:
    """FLOPs of the bucket's timed call: the forward's, or 2.5 times that for the backward (a
    packed batch: its sequences' own)."""
    s = representative_problem(bucket)
    if bucket.varlen:
        half = 0.5 if bucket.mask == "causal" else 1.0
        fwd = sum(4.0 * s.heads_q * n * n * s.head_dim * half for n in varlen_lengths(bucket))
    else:
        fwd = s.flops()
    return fwd * (2.5 if bucket.direction == "bwd" else 1.0)


class Evaluator(Protocol):
    def compile(self, bucket: Bucket, candidates: list[TuningParams]) -> dict[TuningParams, str | None]:
        """Compile candidates (in parallel where possible); None for success, else the reason."""

    def measure(self, bucket: Bucket, params: TuningParams) -> Measurement:
        """Gate on correctness, then time; raises Rejected."""


# ---------------------------------------------------------------------------------------------
# Test seam


class CostModelEvaluator:
    """Stands in for the GPU in CPU tests of the tuner.

    Cost (ms) of a candidate = base * (1 + 0.25 * distance to ``optimum``) over tiles, warps,
    stages, load path, dQ mode, persistent grid and Gluon partitions, smooth with a single optimum
    (default block_m 128, block_n 64, 4 warps, 2 stages, tma_host, dQ separate), multiplied by the
    bucket's FLOPs so that buckets differ.
    Candidates with ``num_warps == 8 and num_stages == 3 and loads == "tma_device"`` "fail to
    compile" and those with ``block_m == 32 and block_n == 64 and num_stages == 1`` "compute a
    wrong answer" (both reachable past static pruning), so that both rejection paths are exercised.
    ``calls`` counts measurements, to prove resumed studies do not re-measure finished trials.
    """

    def __init__(self, optimum: TuningParams | None = None):
        self.optimum = optimum or TuningParams(block_m=128, block_n=64, num_warps=4, num_stages=2, loads="tma_host")
        self.calls = 0
        self.compiled: list[TuningParams] = []

    def cost_ms(self, bucket: Bucket, p: TuningParams) -> float:
        o = self.optimum
        d = (
            abs(math.log2(p.block_m) - math.log2(o.block_m))
            + abs(math.log2(p.block_n) - math.log2(o.block_n))
            + 0.5 * abs(math.log2(p.num_warps) - math.log2(o.num_warps))
            + 0.3 * abs(p.num_stages - o.num_stages)
            + (0.0 if p.loads == o.loads else 0.4)
            + (0.0 if p.dq_mode == o.dq_mode else 0.3)
            + 0.2 * abs(p.persistent - o.persistent)
            + 0.2 * abs(p.gluon - o.gluon)
        )
        return flops(bucket) / 400e12 * 1e3 * (1.0 + 0.25 * d)

    def compile(self, bucket, candidates):
        self.compiled.extend(candidates)
        return {
            p: (
                "CompileError: stand-in ptxas failure"
                if p.num_warps == 8 and p.num_stages == 3 and p.loads == "tma_device"
                else None
            )
            for p in candidates
        }

    def measure(self, bucket, params):
        self.calls += 1
        if params.block_m == 32 and params.block_n == 64 and params.num_stages == 1:
            raise Rejected("wrong result: stand-in error 1.0e-01 over the criterion")
        ms = self.cost_ms(bucket, params)
        return Measurement(
            median_ms=ms, p20_ms=ms * 0.99, p80_ms=ms * 1.01, tflops=flops(bucket) / ms / 1e9, max_error=1e-3
        )


# ---------------------------------------------------------------------------------------------
# The real thing


def _compile_worker(bucket_key: str, params_data: dict) -> str | None:
    """Compile one variant in a worker process for empty inputs of the bucket's timing shape
    (the same specialisation as the timed call, so the parent hits Triton's on-disk cache).
    Returns None or the failure reason."""
    try:
        import torch

        from ..runtime.backward import backward
        from ..runtime.kvcache import CacheLaunch
        from ..runtime.launch import forward
        from ..runtime.problem import TORCH_DTYPES, make_problem
        from ..store.buckets import Bucket

        bucket = Bucket.parse(bucket_key)
        params = TuningParams.from_dict(params_data)
        if bucket.direction == "decode":
            # One sequence's caches, launched as the whole batch's: the kernels specialise on
            # strides, which a batch shares with its one sequence, and take the batch as a
            # number; the batch's own caches (17 GB at 64 x 64k keys) in every worker at once
            # ran the GPU out of memory.
            inputs, one = cache_inputs(bucket, empty=True, batch=1)
            problem = dataclasses.replace(one, batch=representative_problem(bucket).batch)
            sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
            CacheLaunch(problem, params, sms).run(
                *inputs, *_outputs(inputs[0], (problem.batch, problem.heads_q, problem.seqlen_q)), compile_only=True
            )
            return None
        if bucket.varlen:
            _varlen_compile(bucket, params)
            return None
        s = representative_problem(bucket)
        dt = TORCH_DTYPES[bucket.dtype]
        q = torch.empty(s.batch, s.heads_q, s.seqlen_q, s.head_dim, device="cuda", dtype=dt)
        k = torch.empty(s.batch, s.heads_kv, s.seqlen_k, s.head_dim, device="cuda", dtype=dt)
        problem = make_problem(q, k, k, **_semantics(bucket))
        # Compile without launching: a faulty candidate cannot poison this worker's context.
        if bucket.direction == "bwd":
            lse = torch.empty(s.batch, s.heads_q, s.seqlen_q, device="cuda", dtype=torch.float32)
            backward(q, k, k, q, lse, q, problem, params, compile_only=True)
        else:
            forward(q, k, k, problem, params, compile_only=True)
        return None
    except Exception as e:  # compile errors, OutOfResources, ptxas failures are answers here
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def _job_with_start(started, job_id: int, fn, args):
    """Runs in a worker: records when the job began, so its timeout excludes queueing and
    the worker's start (a spawned interpreter importing torch can take seconds)."""
    started[job_id] = time.time()
    return fn(*args)


class CompilePool:
    """Runs compile jobs on spawned worker processes with a per-job timeout.

    A job's timeout runs from the moment a worker begins it. A job that outlives it (a hung
    compiler) or kills its worker (a crash) is reported as failed; the pool is then
    terminated, which really stops the workers, and the jobs not yet finished are
    resubmitted to a fresh one. Jobs that no worker begins within ``start_timeout_s`` (a
    pool that cannot start) fail too.
    """

    def __init__(self, workers: int, timeout_s: float, start_timeout_s: float = 300.0):
        self.workers = workers
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self._pool = None
        self._manager = None
        self._next_id = 0

    def _get(self):
        if self._pool is None:
            # spawn: CUDA cannot be used in forked children of a process that initialised it
            ctx = multiprocessing.get_context("spawn")
            self._manager = ctx.Manager()
            self._started = self._manager.dict()
            self._pool = ctx.Pool(self.workers)
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None
        if self._manager is not None:
            self._manager.shutdown()
            self._manager = None

    def run(self, fn, jobs: dict) -> dict:
        """{key: args} -> {key: fn(*args), or a failure reason string}."""
        out: dict = {}
        pending = dict(jobs)
        while pending:
            pool = self._get()
            handles = {}
            for key, args in pending.items():
                self._next_id += 1
                handles[key] = (
                    self._next_id,
                    pool.apply_async(_job_with_start, (self._started, self._next_id, fn, args)),
                )
            submitted = time.time()
            pending = {}
            while handles:
                for key, (_, handle) in list(handles.items()):
                    if handle.ready():
                        try:
                            out[key] = handle.get()
                        except Exception as e:  # the job raised in the worker
                            out[key] = f"{type(e).__name__}: {e}"
                        del handles[key]
                if not handles:
                    break
                now, began = time.time(), dict(self._started)
                late = [key for key, (jid, _) in handles.items() if jid in began and now - began[jid] > self.timeout_s]
                unstarted = now - submitted > self.start_timeout_s and all(
                    jid not in began for jid, _ in handles.values()
                )
                if late or unstarted:
                    for key in late:
                        out[key] = f"compile timed out after {self.timeout_s:.0f} s (or its worker died)"
                    if unstarted:
                        for key in handles:
                            out[key] = f"no worker began the job within {self.start_timeout_s:.0f} s"
                    self.close()  # stops the hung or dead worker's job; the others run again
                    pending = {key: jobs[key] for key in handles if key not in out}
                    break
                time.sleep(0.02)
        return out


class GpuEvaluator:
    """Compiles candidates on a process pool, gates them on correctness, times them with do_bench."""

    def __init__(self, *, workers: int | None = None, compile_timeout_s: float = 180.0, seed: int = 0):
        self.seed = seed
        self._inputs: dict[Bucket, tuple] = {}
        self._pool = CompilePool(workers or min(16, os.cpu_count() or 1), compile_timeout_s)

    def close(self) -> None:
        self._pool.close()

    def compile(self, bucket, candidates):
        return self._pool.run(_compile_worker, {p: (bucket.key, p.to_dict()) for p in candidates})

    def _problem_inputs(self, bucket: Bucket):
        import torch

        from ..runtime.problem import TORCH_DTYPES, make_problem, random_normal

        if bucket not in self._inputs:
            s = representative_problem(bucket)
            kw = dict(
                dtype=TORCH_DTYPES[bucket.dtype],
                device="cuda",
                generator=torch.Generator(device="cuda").manual_seed(self.seed),
            )
            q = random_normal(s.batch, s.heads_q, s.seqlen_q, s.head_dim, **kw)
            k = random_normal(s.batch, s.heads_kv, s.seqlen_k, s.head_dim, **kw)
            v = random_normal(s.batch, s.heads_kv, s.seqlen_k, s.head_dim, **kw)
            kw = _semantics(bucket)
            self._inputs = {bucket: (q, k, v, make_problem(q, k, v, **kw))}  # one bucket's inputs at a time
        return self._inputs[bucket]

    def measure(self, bucket, params):
        run = self._decode if bucket.direction == "decode" else self._varlen if bucket.varlen else self._attention
        try:
            t, error = run(bucket, params)
        except Rejected:
            raise
        except Exception as e:  # out of resources or memory: this candidate; a CUDA fault: the device
            reason = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            raise Rejected(reason, fatal=_is_cuda_fault(e)) from None
        return Measurement(
            median_ms=t.median_ms,
            p20_ms=t.p20_ms,
            p80_ms=t.p80_ms,
            tflops=flops(bucket) / t.median_ms / 1e9,
            max_error=error,
        )

    def _attention(self, bucket: Bucket, params: TuningParams):
        """The forward or backward: gate on an odd small problem, then time the representative
        one; (timing, the gate's largest error)."""
        import torch

        from ..bench.correctness import check_backward, check_forward
        from ..bench.timing import measure as time_it
        from ..runtime.backward import BackwardLaunch, backward
        from ..runtime.defaults import bucket_default
        from ..runtime.device import cuda_device_info
        from ..runtime.launch import Launch, forward
        from ..runtime.problem import TORCH_DTYPES, make_problem, random_normal

        if params.gluon and torch.cuda.get_device_capability()[0] != 9:
            # gluon_ready would send every launch to the Triton fallback: not this candidate's time
            raise Rejected("Gluon kernels run on sm90 (Hopper) only")
        # Gate: fresh random inputs of an odd small shape with the bucket's semantics.
        s = representative_problem(bucket)
        kw = dict(dtype=TORCH_DTYPES[bucket.dtype], device="cuda")
        nq, nk = min(s.seqlen_q, 333) | 1, min(s.seqlen_k, 517) | 1
        gq = random_normal(2, 2 * bucket.group, nq, s.head_dim, **kw)
        gk = random_normal(2, 2, nk, s.head_dim, **kw)
        gv = random_normal(2, 2, nk, s.head_dim, **kw)
        gp = make_problem(gq, gk, gv, **_semantics(bucket))
        bwd = bucket.direction == "bwd"
        # The backward is timed on the forward's outputs, computed once with the default forward.
        fwd_params = params
        if bwd:
            arch = cuda_device_info(torch.cuda.current_device()).arch
            fwd_params = bucket_default(dataclasses.replace(bucket, direction="fwd"), arch)
        out = torch.full(gq.shape, float("nan"), device="cuda", dtype=TORCH_DTYPES[gp.kernel_spec().out_dtype])
        lse = torch.full((2, 2 * bucket.group, nq), float("nan"), device="cuda")
        forward(gq, gk, gv, gp, fwd_params, out=out, lse=lse)
        if bwd:
            dout = torch.randn_like(out)
            grads = [torch.full_like(t, float("nan")) for t in (gq, gk, gv)]
            backward(gq, gk, gv, out, lse, dout, gp, params, dq=grads[0], dk=grads[1], dv=grads[2])
            torch.cuda.synchronize()
            verdict = check_backward(gq, gk, gv, gp, dout, *grads)
            error = max(e for e, _ in verdict.errors.values())
        else:
            torch.cuda.synchronize()
            verdict = check_forward(gq, gk, gv, gp, out, lse)
            error = verdict.out_err
        if not verdict.ok:
            raise Rejected(f"wrong result: {verdict}")
        q, k, v, problem = self._problem_inputs(bucket)
        if bwd:
            o, o_lse = forward(q, k, v, problem, fwd_params)
            dout = torch.randn_like(o)
            timed = [torch.full_like(t, float("nan")) for t in (q, k, v)]
            # timed as attention() runs it: with the launch it keeps per call shape
            kept = BackwardLaunch(problem, params)
            t = time_it(lambda: kept.run(q, k, v, o, o_lse, dout, dq=timed[0], dk=timed[1], dv=timed[2]))
        else:
            timed = [torch.full(q.shape, float("nan"), device="cuda", dtype=out.dtype)]
            kept = Launch(problem, params, cuda_device_info(torch.cuda.current_device()).sm_count)
            t = time_it(lambda: forward(q, k, v, problem, params, out=timed[0], launch=kept))
        if any(torch.isnan(x).any() for x in timed):
            raise Rejected("NaN in the timed output")
        return t, error

    def _decode(self, bucket: Bucket, params: TuningParams):
        """Gate on a small cache of odd lengths (0, 1, a part-filled page, new keys appended),
        then time the representative full caches as attention_with_kvcache runs them (a kept
        launch on this GPU's SMs); (timing, the gate's largest error)."""
        import torch

        from ..bench.correctness import check_cache
        from ..bench.timing import measure as time_it
        from ..runtime.kvcache import CacheLaunch, cache_forward

        sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        gate, problem = cache_inputs(bucket, gate=True, seed=self.seed)
        before = (gate[0], gate[1].clone(), gate[2].clone(), *gate[3:])
        out, lse = _outputs(gate[0], (problem.batch, problem.heads_q, problem.seqlen_q), poison=True)
        cache_forward(*gate, problem, params, launch=CacheLaunch(problem, params, sms), out=out, lse=lse)
        torch.cuda.synchronize()
        verdict = check_cache(before, problem, out, lse, (gate[1], gate[2]))
        if not verdict.ok:
            raise Rejected(f"wrong result: {verdict}")
        if bucket not in self._inputs:
            self._inputs = {}  # one bucket's inputs at a time: the last one's go first
            self._inputs[bucket] = cache_inputs(bucket, seed=self.seed)
        inputs, problem = self._inputs[bucket]
        out, lse = _outputs(inputs[0], (problem.batch, problem.heads_q, problem.seqlen_q), poison=True)
        kept = CacheLaunch(problem, params, sms)
        t = time_it(lambda: cache_forward(*inputs, problem, params, launch=kept, out=out, lse=lse))
        if torch.isnan(out).any():
            raise Rejected("NaN in the timed output")
        return t, verdict.out_err

    def _varlen(self, bucket: Bucket, params: TuningParams):
        """A packed batch's forward or backward: gate on a small batch mixing lengths 0, 1 and
        odd ones, then time the representative batch as attention_varlen runs it (kept
        launches); (timing, the gate's largest error)."""
        import torch

        from ..bench.correctness import check_varlen
        from ..bench.timing import measure as time_it
        from ..runtime.backward import BackwardLaunch
        from ..runtime.defaults import bucket_default
        from ..runtime.device import cuda_device_info
        from ..runtime.launch import Launch
        from ..runtime.varlen import varlen_backward, varlen_forward

        arch = cuda_device_info(torch.cuda.current_device()).arch
        bwd = bucket.direction == "bwd"
        # the backward runs on the default forward's outputs
        fwd_params = bucket_default(dataclasses.replace(bucket, direction="fwd"), arch) if bwd else params
        gate, problem = varlen_inputs(bucket, gate=True, seed=self.seed)
        out, lse = _outputs(gate[0], (problem.heads_q, problem.total_q), poison=True)
        varlen_forward(*gate, problem, fwd_params, out=out, lse=lse)
        grads = dout = None
        if bwd:
            dout = torch.randn_like(out)
            grads = [torch.full_like(t, float("nan")) for t in gate[:3]]
            names = dict(zip(("dq", "dk", "dv"), grads))
            varlen_backward(*gate[:3], out, lse, dout, *gate[3:], problem, BackwardLaunch(problem, params), **names)
        torch.cuda.synchronize()
        verdict = check_varlen(gate, problem, out, lse, dout, grads)
        if not verdict.ok:
            raise Rejected(f"wrong result: {verdict}")
        if bucket not in self._inputs:
            self._inputs = {bucket: varlen_inputs(bucket, seed=self.seed)}  # one bucket's inputs at a time
        inputs, problem = self._inputs[bucket]
        out, lse = _outputs(inputs[0], (problem.heads_q, problem.total_q), poison=True)
        forward_launch = Launch(problem, fwd_params)
        if bwd:
            varlen_forward(*inputs, problem, fwd_params, out=out, lse=lse, launch=forward_launch)
            dout = torch.randn_like(out)
            timed = [torch.full_like(t, float("nan")) for t in inputs[:3]]
            names = dict(zip(("dq", "dk", "dv"), timed))
            kept = BackwardLaunch(problem, params)
            t = time_it(lambda: varlen_backward(*inputs[:3], out, lse, dout, *inputs[3:], problem, kept, **names))
        else:
            timed = [out]
            t = time_it(lambda: varlen_forward(*inputs, problem, params, out=out, lse=lse, launch=forward_launch))
        if any(torch.isnan(x).any() for x in timed):
            raise Rejected("NaN in the timed output")
        return t, verdict.error


def varlen_inputs(bucket: Bucket, *, gate: bool = False, empty: bool = False, seed: int = 0):
    """((q, k, v, cu_seqlens_q, cu_seqlens_k), Problem) of a packed bucket on the current GPU:
    the representative batch (``varlen_lengths``; ``empty``: uninitialised, for compiling), or
    with ``gate`` a small one of 2 k/v heads mixing lengths 0, 1 and odd ones, its query and key
    lengths apart."""
    import torch

    from ..runtime.problem import TORCH_DTYPES, make_varlen_problem, random_normal

    s = representative_problem(bucket)
    heads_kv = 2 if gate else s.heads_kv
    if gate:
        longest = min(s.seqlen_q, 333) | 1
        lengths_q, lengths_k = [0, 1, longest, 77], [5, 1, longest + 38, 0]
    else:
        lengths_q = lengths_k = varlen_lengths(bucket)
    g = torch.Generator(device="cuda").manual_seed(seed)
    kw = dict(dtype=TORCH_DTYPES[bucket.dtype], device="cuda")

    def draw(rows, heads):
        shape = (rows, heads, s.head_dim)
        return torch.empty(*shape, **kw) if empty else random_normal(*shape, **kw, generator=g)

    def offsets(lengths):
        return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device="cuda")

    q = draw(sum(lengths_q), heads_kv * bucket.group)
    k, v = draw(sum(lengths_k), heads_kv), draw(sum(lengths_k), heads_kv)
    inputs = (q, k, v, offsets(lengths_q), offsets(lengths_k))
    return inputs, make_varlen_problem(*inputs, max(lengths_q), max(lengths_k), **_semantics(bucket))


def _varlen_compile(bucket: Bucket, params: TuningParams) -> None:
    """Compile a packed bucket's kernels for ``params`` without launching them."""
    import torch

    from ..runtime.backward import BackwardLaunch
    from ..runtime.launch import Launch
    from ..runtime.varlen import batch_view

    inputs, problem = varlen_inputs(bucket, empty=True)
    out, lse = _outputs(inputs[0], (problem.heads_q, problem.total_q))
    b = problem.batch
    views = [batch_view(t, b) for t in (*inputs[:3], out)]
    if bucket.direction == "bwd":
        grads = [batch_view(torch.empty_like(t), b) for t in inputs[:3]]
        BackwardLaunch(problem, params).run(
            *views, lse, views[3], dq=grads[0], dk=grads[1], dv=grads[2], cu_seqlens=inputs[3:], compile_only=True
        )
    else:
        Launch(problem, params).run(*views, lse, cu_seqlens=inputs[3:], compile_only=True)


def cache_inputs(bucket: Bucket, *, gate: bool = False, empty: bool = False, seed: int = 0, batch: int | None = None):
    """((q, k_cache, v_cache, cache_seqlens, block_table, k, v), Problem) of a decode bucket on
    the current GPU: the representative problem's full caches (``empty``: uninitialised, for
    compiling; ``batch``: of that many sequences), or with ``gate`` a small one of 2 x 2 k/v
    heads whose sequences hold 0 and an odd number of keys, appending two. A paged cache's
    pages are shuffled in the table."""
    import torch

    from ..runtime.problem import TORCH_DTYPES, make_kvcache_problem, random_normal

    s = representative_problem(bucket)
    batch, heads_kv, capacity = (2, 2, min(s.seqlen_k, 640)) if gate else (batch or s.batch, s.heads_kv, s.seqlen_k)
    page = bucket.page
    if page:
        capacity = -(-capacity // page) * page
    g = torch.Generator(device="cuda").manual_seed(seed)
    kw = dict(dtype=TORCH_DTYPES[bucket.dtype], device="cuda")

    def draw(*shape):
        return torch.empty(*shape, **kw) if empty else random_normal(*shape, **kw, generator=g)

    q = draw(batch, s.seqlen_q, heads_kv * bucket.group, s.head_dim)
    rows = (batch * capacity // page, page) if page else (batch, capacity)
    k_cache, v_cache = draw(*rows, heads_kv, s.head_dim), draw(*rows, heads_kv, s.head_dim)
    table = None
    if page:
        per = capacity // page
        table = torch.randperm(batch * per, device="cuda", generator=g).view(batch, per).to(torch.int32)
    k = v = None
    if gate:
        lengths = [0, capacity - 2 - (capacity % 2 == 0)]
        k, v = draw(batch, 2, heads_kv, s.head_dim), draw(batch, 2, heads_kv, s.head_dim)
    else:
        lengths = [capacity] * batch
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    inputs = (q, k_cache, v_cache, lens, table, k, v)
    return inputs, make_kvcache_problem(*inputs, **_semantics(bucket))


def _outputs(q, lse_shape: tuple, *, poison: bool = False):
    """(out like q, fp32 lse of ``lse_shape``) for a call, filled with NaN when ``poison``."""
    import torch

    out = torch.empty_like(q)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    if poison:
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
    return out, lse


def _semantics(bucket: Bucket) -> dict:
    """attention() keywords that reproduce a bucket's mask kind and softcap."""
    kw = {"causal": bucket.mask == "causal", "softcap": 30.0 if bucket.softcap else 0.0}
    if bucket.mask == "local":
        kw["window_size"] = (256, 0)
    return kw
