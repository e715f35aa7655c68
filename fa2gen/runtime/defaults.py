"""Heuristic default tuning params per arch: what runs when nothing tuned applies.

The sm90 table was chosen by measuring a sweep on an H200; other arches use conservative
pointer-load tiles shrunk to fit their shared memory.
"""

from __future__ import annotations

import dataclasses

from ..generator.arch import fits
from ..generator.spec import KernelSpec, TuningParams, next_pow2, unsupported

# (head_dim_padded upper bound, params), first match wins. At 4k tokens and more the
# sweep found the same winners with and without the causal mask; short causal problems
# have their own table below.
_SM90 = [
    # Sweep of 28 variants per spec on the FA2 grid (fp16, H200): D=64 prefers short, wide
    # tiles (64x128); D=128 prefers 128x64 with two stages. Host descriptors beat in-kernel
    # ones and pointers on all 24 fp16 cells' geomean (372 vs 340 vs 296 TFLOP/s end to end):
    # building and fencing descriptors in the kernel costs more GPU time than it saves the host.
    (64, TuningParams(block_m=64, block_n=128, num_warps=4, num_stages=2, loads="tma_host")),
    (128, TuningParams(block_m=128, block_n=64, num_warps=4, num_stages=2, loads="tma_host")),
    # D=256 (H200, B=4 H=8 N=4096): a 64x256 fp32 accumulator starves 4 warps of registers;
    # 128x64 with 8 warps ran 532/451 TFLOP/s (full/causal) against 416/356 for 64x64 with 4.
    (256, TuningParams(block_m=128, block_n=64, num_warps=8, num_stages=2, loads="tma_host")),
]

# Causal problems with short queries: each query block sees few key blocks, so shorter
# query tiles (more programs, less diagonal waste) win. Measured end to end on the
# canonical fp16 cells on the H200 (benchmarks/overhead.py):
# D=64: 64x64 s2 228 vs 212 TFLOP/s at N=512, 294 vs 289 at 1024 (64x128 wins above);
# D=128: 64x64 s3 253 vs 234 at N=512, 340 vs 320 at 1024, 402 vs 378 at 2048
# (128x64 wins at 4096). Keyed by (head_dim_padded bound, longest bucket query length).
_SM90_SHORT_CAUSAL = [
    (64, 1024, TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=2, loads="tma_host")),
    (128, 2048, TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=3, loads="tma_host")),
]

# fp8 (e4m3) at 64 < D <= 128 (H200, B*N = 16k, D=128, N=4k and 16k): 128 x 64 with 4 warps
# and 3 stages ran 712 and 734 TFLOP/s, against 680 and 730 at 2 stages, 643 and 688 for
# 128 x 128 w8 s3. Other head dims take the fp16 table until measured.
_SM90_FP8 = [
    (64, None),
    (128, TuningParams(block_m=128, block_n=64, num_warps=4, num_stages=3, loads="tma_host")),
]

_AMPERE = [
    (64, TuningParams(block_m=128, block_n=64, num_warps=4, num_stages=3)),
    (128, TuningParams(block_m=128, block_n=32, num_warps=4, num_stages=2)),
    (256, TuningParams(block_m=64, block_n=32, num_warps=4, num_stages=2)),
]

# Backward (block_m: rows a program owns, block_n: rows its loop steps through). On sm90
# these are the winners of the H200 tuning runs of the backward buckets (fp16 and bf16,
# D 64/128/256, causal on and off, N 512-16k): at D=64, 4 warps with 4 stages and host
# descriptors (3 stages and pointers when causal) won the bf16 buckets once the space held
# 4-5 stages, 1.14-1.32x over 8 warps; at D=128, 128 x 32 with
# 8 warps, 3 stages and pointers won 19 of 24 buckets; at D=256, 16 x 32 with 4 warps and
# host descriptors won all 12. The spill-free tiles first picked from ptxas register counts
# alone (64 x 16, host descriptors) ran 2.1-3.5x slower at D=128: 16-row matmuls cost more
# than the spills they avoid. Ampere keeps those register-based picks.
_BWD_SM90 = [
    (64, TuningParams(block_m=128, block_n=32, num_warps=4, num_stages=4, loads="tma_host")),
    (128, TuningParams(block_m=128, block_n=32, num_warps=8, num_stages=3)),
    (256, TuningParams(block_m=16, block_n=32, num_warps=4, num_stages=2, loads="tma_host")),
]
# Causal rows (head dim bound, longest query length, params), taken before the table above.
# Short causal D=128 (N <= 1k): 64 x 16 with 4 warps and host descriptors won all four such
# buckets, 1.06-1.17x over 128 x 32 (few key blocks per program, so smaller programs balance).
_BWD_SM90_CAUSAL = [
    (64, float("inf"), TuningParams(block_m=128, block_n=32, num_warps=4, num_stages=3)),
    (128, 1024, TuningParams(block_m=64, block_n=16, num_warps=4, num_stages=3, loads="tma_host")),
]
# Packed batches' forward on sm90 at D=128, no window: in-kernel descriptors with one warp
# group (default_params says why)
_SM90_VARLEN_D128 = TuningParams(block_m=128, block_n=64, num_warps=4, num_stages=2, loads="tma_device")
# ... and its backward at D=128: 64 x 32 with one warp group and three stages ran 0.77x the dense
# backward without a mask and 0.74x causal, against the dense default tile's 0.74x and 0.68x
# (H100, bf16, the same batch, one run; 64 x 64 with two stages ran within 2% of it; windows
# not measured). At D=64 the dense default's tile (128 x 32, 4 warps, 4 stages) led the same
# sweep: 0.80x and 0.79x.
_SM90_VARLEN_BWD_D128 = TuningParams(block_m=64, block_n=32, num_warps=4, num_stages=3)
# Where the Gluon kernels take the packed batch at D=128 (no mask or causal; descriptors built
# per sequence in the kernel), they lead: the forward on 128 x 128 tiles with two compute
# partitions and three stages ran 0.99x the dense forward's TFLOP/s without a mask and 0.98x
# causal, against 0.83x and 0.84x for the Triton template above; the backward's Gluon dK/dV and
# dQ kernels on 64 x 64 tiles with two stages ran 0.94x and 0.92x, against 0.77x and 0.74x
# (H100, bf16, 16k tokens in sequences [8192, 1196, 1, 1654, 2733, 2608], one run).
_SM90_VARLEN_GLUON_D128 = TuningParams(block_m=128, block_n=128, num_warps=8, num_stages=3, loads="tma_device", gluon=2)
_SM90_VARLEN_GLUON_BWD_D128 = TuningParams(
    block_m=64, block_n=64, num_warps=4, num_stages=2, loads="tma_device", gluon=2
)
# ... and at D=64 the one pass (dq_mode atomic: dQ added into fp32 sums by packed row) ran the
# backward at 0.99x the dense backward's TFLOP/s without a mask and 0.95x causal, against 0.82x
# for the Triton template's pointer loads and 0.81x and 0.80x for the Gluon dK/dV and dQ kernels
# above (H100, bf16, the same batch, one run; 3 stages instead of 2 within 1%).
_SM90_VARLEN_ONE_PASS_D64 = TuningParams(
    block_m=128, block_n=64, num_warps=8, num_stages=2, loads="tma_device", dq_mode="atomic", gluon=1
)
_BWD_AMPERE = [
    (64, TuningParams(block_m=64, block_n=32, num_warps=4, num_stages=2)),
    (128, TuningParams(block_m=64, block_n=16, num_warps=8, num_stages=2)),
    (256, TuningParams(block_m=64, block_n=16, num_warps=8, num_stages=1)),
]

# Dropout on sm90. Forward, D=128: the Philox draws hold registers beside the 128-row tile, whose
# 4-warp form spilled 900 B (ptxas); two warp groups hold it in 217 registers, no spill. Backward,
# D=64: 64 x 32 with host descriptors (no spill) ran 1.13-1.26x the plain default's 128 x 32 on the
# H200 (bf16, N 1k and 4k, causal and not); at D=128 the plain default stayed fastest of four.
_SM90_DROPOUT_D128 = TuningParams(block_m=128, block_n=64, num_warps=8, num_stages=2, loads="tma_host")
_SM90_DROPOUT_BWD_D64 = TuningParams(block_m=64, block_n=32, num_warps=4, num_stages=3, loads="tma_host")

# Under Triton's interpreter the cost is per program and per block op, not per FLOP.
_INTERPRETER = TuningParams(block_m=32, block_n=32, num_warps=4, num_stages=1)
_BWD_INTERPRETER = TuningParams(block_m=32, block_n=16, num_warps=4, num_stages=1)


def shrink_to_fit(spec: KernelSpec, params: TuningParams, arch: str) -> TuningParams:
    """Fewer stages, then narrower and shorter tiles, until the variant fits ``arch``."""
    while fits(spec, params, arch) is not None:
        if params.num_stages > 1:
            params = params.replace(num_stages=params.num_stages - 1)
        elif params.block_n > (32 if spec.fp8 else 16):  # fp8 matmuls reduce over >= 32 keys
            params = params.replace(block_n=params.block_n // 2)
        elif params.block_m > 16:
            params = params.replace(block_m=params.block_m // 2)
        else:
            break
    return params


# A call of at most this many FLOPs and bytes (the bucket's upper edge: 4 * B * Hq * Nq * Nk * D,
# and q, k, v and out in 16 bits) runs in a few microseconds of GPU time, under what the host
# spends launching it: such calls take pointer loads rather than host descriptors, whose four
# descriptors cost the host 6-15 us a call (H100, forward() on 1 x 8 x 128 x 64 causal: 24.5 us
# with pointer loads against 30.2 with host descriptors; on a slower host 29.3 against 44.6, the
# GPU time 4.57 against 4.93 us).
HOST_BOUND_FLOPS = 1 << 30
HOST_BOUND_BYTES = 1 << 23


def host_bound(bucket) -> bool:
    """Whether every problem of ``bucket`` is small enough that the host's time per call, not
    the GPU's, sets its speed (``HOST_BOUND_FLOPS``, ``HOST_BOUND_BYTES``)."""
    b, nq, nk, d = bucket.batch_heads, bucket.seqlen_q, bucket.seqlen_k, bucket.head_dim
    return 4 * b * nq * nk * d <= HOST_BOUND_FLOPS and 4 * b * (nq + nk) * d <= HOST_BOUND_BYTES


def bucket_default(bucket, arch: str, *, atomics: bool = True, spec: KernelSpec | None = None) -> TuningParams:
    """The default for every problem of a ``fa2gen.store.buckets.Bucket`` (sized for its
    rounded-up query length, so the whole bucket gets one answer; decode: its rounded-up
    query tokens times its rounded-up GQA group; a host-bound bucket's host descriptors
    become pointer loads); ``atomics=False``: one whose backward adds nothing with atomics.
    ``spec``: the call's kernel, where it differs from the bucket's by what buckets do not
    record (ALiBi, dropout), which rules out the Gluon kernels."""
    spec = spec or bucket.kernel_spec()
    if bucket.direction == "decode":
        rows = bucket.seqlen_q * bucket.group
        return decode_default(spec, arch, rows, max(1, bucket.batch_heads // bucket.group))
    params = default_params(spec, arch, bucket.seqlen_q, atomics=atomics)
    if params.loads == "tma_host" and host_bound(bucket):
        pointer = params.replace(loads="pointer")
        if unsupported(spec, pointer) is None and fits(spec, pointer, arch) is None:
            return pointer
    return params


def default_params(spec: KernelSpec, arch: str, seqlen_q: int, *, atomics: bool = True) -> TuningParams:
    """The heuristic default for ``spec`` on ``arch`` ("cpu" means the interpreter);
    ``atomics=False``: a backward that adds nothing with atomics (deterministic)."""
    if spec.direction == "bwd":
        if spec.varlen:  # packed batches: the Gluon kernels where they run (at D=64 the one
            # pass), else the Triton template's pointer loads with dQ in its own kernel
            one_pass = atomics and unsupported(spec, _SM90_VARLEN_ONE_PASS_D64) is None
            if arch == "sm90" and spec.head_dim == 64 and one_pass:
                return _SM90_VARLEN_ONE_PASS_D64
            if arch == "sm90" and spec.head_dim == 128:
                if unsupported(spec, _SM90_VARLEN_GLUON_BWD_D128) is None:
                    return _SM90_VARLEN_GLUON_BWD_D128
                return shrink_to_fit(spec, _SM90_VARLEN_BWD_D128, arch)
            dense = default_params(dataclasses.replace(spec, varlen=False), arch, seqlen_q)
            return shrink_to_fit(spec, dense.replace(loads="pointer", dq_mode="separate", gluon=0), arch)
        if arch == "cpu":
            return _BWD_INTERPRETER
        if arch == "sm90" and spec.dropout and spec.head_dim_padded <= 64:
            return shrink_to_fit(spec, _SM90_DROPOUT_BWD_D64, arch)
        if arch == "sm90" and spec.mask == "causal":
            for bound, longest, params in _BWD_SM90_CAUSAL:
                if spec.head_dim_padded <= bound and seqlen_q <= longest:
                    return shrink_to_fit(spec, params, arch)
        table = _BWD_SM90 if arch == "sm90" else _BWD_AMPERE
        return shrink_to_fit(spec, next(p for bound, p in table if spec.head_dim_padded <= bound), arch)
    if arch == "cpu":
        params = _INTERPRETER
    else:
        table = _SM90 if arch == "sm90" else _AMPERE
        params = next(p for bound, p in table if spec.head_dim_padded <= bound)
        if arch == "sm90" and spec.fp8:
            params = next((p for bound, p in _SM90_FP8 if spec.head_dim_padded <= bound), None) or params
        if arch == "sm90" and spec.mask == "causal":
            for bound, longest, short in _SM90_SHORT_CAUSAL:
                if spec.head_dim_padded <= bound:  # the row of this head dim only
                    params = short if seqlen_q <= longest else params
                    break
        if arch == "sm90" and spec.dropout and spec.head_dim_padded == 128:
            params = _SM90_DROPOUT_D128
    if spec.varlen:
        # Packed batches: on sm90 at D=128 the Gluon forward where it runs (no mask or causal,
        # without softcap, ALiBi or dropout: _SM90_VARLEN_GLUON_D128), else the Triton template
        # on the plain grid. On sm90, pointer loads with two warp groups on 128 x 64 tiles
        # compiled without spills at D=64, 128 and 256 (108 B at a padded D=72; the dense
        # defaults, made for descriptors, spilled 180-840 B at D=128).
        # At D=128, in-kernel descriptors (built per sequence) on 128 x 64 tiles with one warp
        # group ran 0.82x the dense kernel's TFLOP/s, 0.81x causal, against the pointer loads'
        # 0.74x and 0.72x (H100, bf16, 16k tokens in sequences of 1 to 8k, same run); at D=64
        # pointer loads kept the lead (0.92x and 0.91x). Other head dims and windows were not
        # measured (and the descriptors' tile spills 144 B under a window, 80 B causal).
        if arch != "sm90":
            params = params.replace(loads="pointer", persistent=0, gluon=0)
        elif spec.head_dim == 128 and unsupported(spec, _SM90_VARLEN_GLUON_D128) is None:
            params = _SM90_VARLEN_GLUON_D128
        elif spec.head_dim == 128 and spec.mask != "local":
            # (dropout's Philox draws beside the 128-row tile: two warp groups, as in the dense
            # dropout default; one spilled 968 B, two none)
            params = _SM90_VARLEN_D128.replace(num_warps=8) if spec.dropout else _SM90_VARLEN_D128
        else:
            params = TuningParams(128, 64, 8, 3, "pointer")
    # Short query blocks (decoding, chunked prefill): don't compute 128 rows for a handful.
    if seqlen_q < params.block_m:
        params = params.replace(block_m=max(16, min(params.block_m, next_pow2(seqlen_q))))
    if arch != "cpu":
        params = shrink_to_fit(spec, params, arch)
    return params


# Decoding reads the cache once and is bound by memory: each program keeps Q resident and
# streams K and V tiles num_stages deep. The query heads of one k/v head are rows of one tile
# (Sq * group rows). From a sweep on the H100 (bf16, D=128, Hq=32, Hkv=8, 1 to 16 query
# tokens, batch 1 to 64, 512 to 128k keys, contiguous and in pages of 16; 18 tilings, each at
# several split counts):
# - with enough (batch, k/v head) pairs to fill the GPU without splits (batch 64: 512), 128
#   keys a step, 3 stages, read 3138-3223 GB/s against 2903-2983 for 64 keys;
# - with fewer, split, 64 keys a step and 3 stages led at batch 1 and 8 (2857 GB/s at 128k
#   keys, batch 1; 3029 at 32k, batch 8), and one program an SM (splits = SMs / pairs) beat
#   two an SM;
# - through pages, 128 keys a step and 2 stages led or tied, with twice the splits (2756
#   GB/s at 128k, batch 1, 32 splits);
# - 16 query tokens (64-row tiles) read best 64 keys a step.
_DECODE_FILLS = 256  # (batch, k/v head) pairs that fill an sm90 GPU without splits
_DECODE_SM90_D256 = TuningParams(block_m=16, block_n=32, num_warps=4, num_stages=3)
_DECODE_INTERPRETER = TuningParams(block_m=16, block_n=16, num_warps=4, num_stages=1)


def decode_default(spec: KernelSpec, arch: str, rows: int, streams: int) -> TuningParams:
    """The decode template's default for ``spec`` on ``arch`` with ``rows`` packed query rows
    (query tokens x the GQA group: one tile holds them all, up to 128) and ``streams``
    (batch, k/v head) pairs."""
    block_m = max(16, min(128, next_pow2(rows)))
    if arch == "cpu":
        return _DECODE_INTERPRETER.replace(block_m=min(32, block_m))
    if spec.head_dim_padded > 128:
        params = _DECODE_SM90_D256
    elif spec.paged:
        params = TuningParams(block_m=16, block_n=128, num_warps=4, num_stages=2)
    else:
        params = TuningParams(block_m=16, block_n=128 if streams >= _DECODE_FILLS else 64, num_warps=4, num_stages=3)
    params = params.replace(block_m=block_m)
    if block_m > 16:  # (three stages through pages too: at 16 query tokens the H100's tuner found
        # them 1.06-1.12x ahead of two at 8k and 64k keys, paged as fast as contiguous within 7%)
        params = params.replace(block_n=min(params.block_n, 64), num_warps=8 if block_m == 128 else 4, num_stages=3)
    if spec.head_dim != spec.head_dim_padded:  # (the padded columns' masks: 128 keys spilled at D=72)
        params = params.replace(block_n=min(params.block_n, 64))
    return shrink_to_fit(spec, params, arch)


# The fewest keys a split is worth: each split costs a partial row written and read back.
_DECODE_MIN_KEYS = 128


def decode_combine(params: TuningParams, splits: int) -> str:
    """Who combines the splits' partials: the tuned ``combine`` knob, else the last split to
    finish where there are two, the combine kernel from three. (H100, bf16, D=128, 32 query
    heads over 8, one run: with two splits the last split's combine read 1036 against 930 GB/s
    at batch 8 and 512 keys, 2636 against 2586 at 8k keys, even with 16 query tokens; with 8
    or 16 splits it lost 2-20%, one program combining many partials.)"""
    if params.combine != "auto":
        return params.combine
    return "last" if splits == 2 else "kernel"


def decode_splits(problem, params: TuningParams, sm_count: int) -> int:
    """How many programs split each sequence's keys: the tuned ``splits`` knob, else one
    program an SM (two through pages) without exceeding a wave, each split holding at least
    ``_DECODE_MIN_KEYS`` keys of the cache's capacity, and at most the combine's
    ``MAX_SPLITS``."""
    from ..generator.descriptors.attn_decode import MAX_SPLITS

    if params.splits:
        return params.splits
    rows = problem.seqlen_q * problem.group
    programs = problem.batch * problem.heads_kv * -(-rows // params.block_m)
    want = (2 if problem.page_size else 1) * sm_count // max(1, programs)
    return max(1, min(want, problem.seqlen_k // _DECODE_MIN_KEYS, MAX_SPLITS))
