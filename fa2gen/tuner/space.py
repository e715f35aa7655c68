"""Per-arch search spaces and the static pruning rules applied before compiling.

A point that fails a rule is never compiled: the study records it as pruned with the
reason, so the sampler learns to avoid it (failed trials would be proposed again).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields

from ..generator.arch import ARCHES, fits
from ..generator.spec import KernelSpec, TuningParams, unsupported
from ..store.buckets import Bucket

_LATER_KNOBS = {"gluon"}


@dataclass(frozen=True)
class SearchSpace:
    arch: str
    block_m: tuple[int, ...]
    block_n: tuple[int, ...]
    num_warps: tuple[int, ...]
    num_stages: tuple[int, ...]
    loads: tuple[str, ...]
    dq_mode: tuple[str, ...] = ("separate",)  # the backward's; the forward has one choice
    persistent: tuple[int, ...] = (0,)  # the forward's programs per SM; 0: one per tile
    gluon: tuple[int, ...] = (0,)  # the forward's Gluon compute partitions; 0: the Triton template

    def choices(self) -> dict[str, tuple]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "arch"}

    def size(self) -> int:
        n = 1
        for values in self.choices().values():
            n *= len(values)
        return n

    def contains(self, params: TuningParams) -> bool:
        return all(getattr(params, name) in values for name, values in self.choices().items())

    def digest(self) -> str:
        """Short hash of the choices: a study belongs to one space (Optuna cannot resume a
        study whose categorical choices changed), so studies are named with it. A knob added
        later is left out while it holds only its default, so that the studies of spaces it
        does not change keep their names."""
        choices = {k: v for k, v in self.choices().items() if not (k in _LATER_KNOBS and v == (0,))}
        return hashlib.sha256(repr(sorted(choices.items())).encode()).hexdigest()[:8]


_TILES = (16, 32, 64, 128, 256)
SPACES = {
    # Ampere has cp.async but no tensor descriptors; 164 KB of shared memory on A100 (sm80),
    # about 100 KB on consumer Ampere/Ada (sm86, sm89), where 5 stages never fit a useful tile.
    "sm80": SearchSpace("sm80", _TILES[:4], _TILES[:4], (4, 8), (1, 2, 3, 4, 5), ("pointer",)),
    "sm86": SearchSpace("sm86", _TILES[:4], _TILES[:4], (4, 8), (1, 2, 3, 4), ("pointer",)),
    "sm89": SearchSpace("sm89", _TILES[:4], _TILES[:4], (4, 8), (1, 2, 3, 4), ("pointer",)),
    # Hopper: 228 KB, warp groups of 4 warps, three load paths, persistent grids, and the
    # warp-specialised Gluon forward. One Triton program per SM halves occupancy and measured
    # 0.32-0.78x the plain grid on the H200, so persistent=1 is searched for the Gluon forward
    # only (prune_reason). A 128-row Gluon program fills an SM alone at D=128: its grid of two
    # per SM runs as two waves, the second starting wherever an SM frees, which evens out the
    # causal mask's uneven tiles: on 128 x 64 tiles 1-8% ahead of one an SM on the H200 (three
    # or four an SM fell 13-15% behind two at N=1k).
    "sm90": SearchSpace(
        "sm90",
        _TILES,
        _TILES[1:],
        (4, 8),
        (1, 2, 3, 4),
        ("pointer", "tma_device", "tma_host"),
        persistent=(0, 1, 2, 3),
        gluon=(0, 1, 2),
    ),
}


def prune_reason(space: SearchSpace, spec: KernelSpec, bucket: Bucket, params: TuningParams) -> str | None:
    """Why ``params`` should not be compiled for ``bucket`` on ``space.arch``, or None."""
    if not space.contains(params):
        return f"outside the {space.arch} search space"
    why = unsupported(spec, params) or fits(spec, params, space.arch)
    if why:
        return why
    # Each warp needs at least 256 elements (one 16x16 MMA tile) of the tile the warps split:
    # the forward's score tile; the backward's block_m x D gradient accumulators.
    split = params.block_n if spec.direction == "fwd" else spec.head_dim_padded
    if params.block_m * split < 256 * params.num_warps:
        return f"{params.block_m}x{split} tile too small for {params.num_warps} warps"
    # Rows past the sequence are pure waste: no tile taller than the bucket needs.
    if spec.direction == "fwd":
        if params.block_m > max(16, bucket.seqlen_q):
            return f"block_m {params.block_m} exceeds the bucket's query length {bucket.seqlen_q}"
        if params.block_n > max(16, bucket.seqlen_k):
            return f"block_n {params.block_n} exceeds the bucket's key length {bucket.seqlen_k}"
    else:  # the backward's tiles hold queries in one kernel and keys in the other
        longest = max(bucket.seqlen_q, bucket.seqlen_k)
        if max(params.block_m, params.block_n) > max(16, longest):
            return f"{params.block_m}x{params.block_n} tiles exceed the bucket's longest sequence {longest}"
    # Hopper's wgmma is issued per warp group of 4 warps, 64 rows each: 8 warps on 64 rows
    # split the rows badly. Every such variant in the H200's fp16 forward sweep ran at 40-60%
    # of the best one.
    # (Forward only: the backward's 64-row tiles need 8 warps to hold their accumulators without
    # spilling, by ptxas's register counts for sm90.)
    if space.arch == "sm90" and spec.direction == "fwd" and params.num_warps == 8 and params.block_m < 128:
        return "8 warps on sm90 need block_m >= 128 (two 64-row warp groups)"
    if space.arch == "sm90" and params.persistent == 1 and not params.gluon:
        return "one persistent Triton program an SM halves occupancy (0.32-0.78x the plain grid on the H200)"
    # Two persistent Gluon programs an SM on 128 x 128 tiles: their shared memory fits two only at
    # D=64, where one a SM measured the same. One a SM spills 24-204 B (ptxas for sm90, fp16
    # D=64 to D=128) and still ran short sequences 1.05-1.12x faster than the shipped configs
    # on the H200, as cuDNN's own short forward is persistent on 128-key blocks.
    if params.gluon and params.persistent == 2 and params.block_m == 128 and params.block_n == 128:
        return "two persistent Gluon programs an SM on 128 x 128 tiles: their shared memory fits two only at D=64"
    # fp8's 256-key steps: two persistent programs an SM do not fit its shared memory at D=128
    # (one takes 176 KB); one an SM masks its first block with an opaque zero, without which
    # it spilled 664 B.
    if params.gluon and spec.fp8 and params.block_n == 256 and params.persistent == 2:
        return "fp8's 256-key Gluon steps: one persistent program an SM at most"
    # Under a causal mask dq_mode matmul's dQ kernel reads the key blocks each 128 queries see,
    # whose skipped tiles the dK/dV kernel zeroes: at D=128 it measured 1.04-1.08x the shipped
    # causal backward on the H200 from N=4k, faster still with the dQ kernel (the tuner
    # decides); at D=64, 0.94-0.96x the shipped one at N=4k and 16k, as it reads dS for twice
    # the heads a FLOP.
    # The Triton dK/dV kernel's dQ atomics lost every bucket of the H200 re-tune (see BWD_SPACES);
    # on sm90 dq_mode atomic is the Gluon one pass only.
    if space.arch == "sm90" and params.dq_mode == "atomic" and params.gluon != 1:
        return "dq_mode atomic on sm90 is the Gluon one pass (gluon=1); the Triton kernel's atomics lost every bucket"
    # The one pass at D=128: its compute partitions need more registers than the worker's dQ
    # matmul leaves them (580-588 B spilled) and it ran 0.67-0.82x the shipped backward on the
    # H200; at D=64 nothing spills and it ran 1.06-1.20x from N=1k.
    if params.dq_mode == "atomic" and params.gluon == 1 and spec.head_dim != 64:
        return "the one pass (dq_mode atomic, gluon=1) spills above D=64 and measured slower there"
    if params.dq_mode == "matmul" and spec.mask == "causal" and spec.head_dim != 128:
        return "dq_mode matmul measured slower than the other backwards under a causal mask at D=64"
    return None


# The backward: pointer loads or host descriptors (no in-kernel ones), short loop steps down
# to 16 rows, which its register budget favours, and up to 5 stages. On sm90 the Triton dK/dV
# kernel does not sum dQ: its per-element atomics and bulk reductions through host
# descriptors lost in all 72 buckets of the H200 re-tune, 0.74x and 0.72x of the same tiles'
# separate kernel. They stay available to `fa2gen generate` and attention(), only not
# searched there; other arches keep both ways until measured. dq_mode matmul (sm90, the Gluon
# dK/dV kernel storing dS for one dQ matmul) is searched, and dq_mode atomic as the Gluon one
# pass only (gluon=1, D=64). 16 warps on sm90: every one tried so far lost (0.40x its
# bucket's winner at best), but none had 128x64 tiles and 3 stages, FlexAttention's D=128
# Hopper tile (with 8 warps in torch 2.13's heuristics); the default's one-knob moves reach it.
BWD_SPACES = {
    arch: SearchSpace(
        arch,
        _TILES[:4] if arch != "sm90" else _TILES,
        _TILES[:4],
        (4, 8, 16) if arch == "sm90" else (4, 8),
        (1, 2, 3, 4, 5) if arch == "sm90" else (1, 2, 3),
        ("pointer", "tma_host") if arch == "sm90" else ("pointer",),
        ("separate", "matmul", "atomic") if arch == "sm90" else ("separate", "atomic"),
        gluon=(0, 1, 2) if arch == "sm90" else (0,),
    )
    for arch in SPACES
}

# Knobs whose values are ordered (sizes, counts): a local move goes to the next value either side.
# (persistent is not: one program an SM is the Gluon forward's alone, so that from the plain
# grid a Triton program's only persistent move is two an SM.)
_ORDERED = {"block_m", "block_n", "num_warps", "num_stages"}


def local_moves(space: SearchSpace, params: TuningParams) -> list[TuningParams]:
    """The points of ``space`` one knob away from ``params``: each ordered knob one step
    down and up (tile sizes halved and doubled, one stage fewer and more), every other
    value of the unordered ones. Ordered by knob as the H200's backward winners differ most
    from one bucket to the next: loop step, stages, load path, warps, then owned rows."""
    order = ["block_n", "num_stages", "loads", "num_warps", "block_m", "dq_mode", "persistent", "gluon"]
    moves = []
    for name in order:
        values = space.choices()[name]
        current = getattr(params, name)
        if name in _ORDERED and current in values:
            i = values.index(current)
            others = [values[j] for j in (i - 1, i + 1) if 0 <= j < len(values)]
        else:
            others = [v for v in values if v != current]
        moves += [params.replace(**{name: v}) for v in others]
    return [m for m in moves if space.contains(m)]


# The Gluon forward's candidates every study of a space with it enqueues, after the default,
# the bucket's own entry and earlier winner and the nearest buckets' winners (so a study of 12
# trials or more measures them all): most of the space's gluon points fail the template's rules
# (warps fixed by block_m, host descriptors only), so a sampler alone rarely proposes a valid
# one. On the H200 two 64-row partitions on 128 x 128 tiles with two stages won 10 of 12
# canonical cells among the Gluon forms; one 64-row partition on 64 x 64 tiles with three
# stages was next at D=128 (on 64 x 128 it spills at D=128 under its 128-register limit).
# The persistent form is for short sequences, where a tile's prologue and epilogue are a
# large share of its time (on 128 x 128 tiles it spills at 168 registers, on 128 x 64 it does
# not). With three stages on 128 x 128 tiles the softmax runs under P @ V: 4-5% faster than
# the shipped forms at N=16k; K's ring there is a slot shorter than V's, so one persistent
# program an SM keeps three of V (4% faster than its two-stage form). 64 x 64 tiles with two
# or three programs an SM on the queue are for the short D=64 causal cells, where the Triton
# template's tiles ran 0.83-0.90x cuDNN; three (an 80-register launch) ran them 1.09-1.12x
# faster than two (D=64 only: at D=128 three do not fit).
GLUON_CANDIDATES = (
    TuningParams(block_m=128, block_n=128, num_warps=8, num_stages=2, loads="tma_host", gluon=2),
    TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=3, loads="tma_host", gluon=1),
    TuningParams(block_m=128, block_n=64, num_warps=8, num_stages=3, loads="tma_host", gluon=2),
    TuningParams(block_m=128, block_n=64, num_warps=8, num_stages=3, loads="tma_host", gluon=2, persistent=2),
    TuningParams(block_m=128, block_n=128, num_warps=8, num_stages=2, loads="tma_host", gluon=2, persistent=1),
    TuningParams(block_m=128, block_n=128, num_warps=8, num_stages=3, loads="tma_host", gluon=2),
    TuningParams(block_m=128, block_n=128, num_warps=8, num_stages=3, loads="tma_host", gluon=2, persistent=1),
    TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=3, loads="tma_host", gluon=1, persistent=2),
    TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=3, loads="tma_host", gluon=1, persistent=3),
)
# fp8 only: 256-key steps on the plain grid ran fp8 D=128 on the H200 1-3% faster than the
# shipped forms without a mask from N=4k and 8-9% under the causal mask at N=16k, 6-7% slower
# there at N=4k. They come first among the Gluon candidates, as a short study did not reach
# them last. One persistent program an SM on them (under the causal mask taking tiles from the
# queue) ran 4-10% faster than the plain grid without a mask and tied it under the mask.
GLUON_FP8_CANDIDATES = (
    TuningParams(block_m=128, block_n=256, num_warps=8, num_stages=2, loads="tma_host", gluon=2),
    TuningParams(block_m=128, block_n=256, num_warps=8, num_stages=2, loads="tma_host", gluon=2, persistent=1),
)


# The backward's Gluon kernels. gluon=1, the dK/dV kernel (delta and dQ stay Triton's, with
# the same tiles, but for dq_mode matmul's and the one pass's dQ): on the H200 64 keys a
# program and 64 queries a step ran 1.27x fa2gen's dK/dV kernel, the best of five forms, and
# won every D=128 bucket of the re-tune; 128 x 32 is the Triton dQ kernel's own favourite
# tile at D=128 (the shipped backward defaults). gluon=2 adds the Gluon dQ kernel on the same
# tiles: 64 x 64 with two stages, and 128 x 32 with three (its dQ kernel prefetches
# num_stages - 1 key blocks; 64 x 64 with three spills in the dK/dV kernel at D=128 causal).
# dq_mode matmul on 64 x 64 tiles, which ran D=128 non-causal backwards 1.06-1.14x faster than
# the shipped ones on the H200, and on 64 x 32 with three stages; on 128 x 32 it lost to both
# (0.80-0.87x the shipped). dq_mode atomic, the one pass, on 128 keys and 64 queries a step
# (the only tile it takes; 128 x 32 steps ran it 1.2x slower).
GLUON_BWD_CANDIDATES = (
    TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=2, loads="tma_host", gluon=1),
    TuningParams(block_m=128, block_n=32, num_warps=8, num_stages=2, loads="tma_host", gluon=1),
    TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=2, loads="tma_host", gluon=2),
    TuningParams(block_m=128, block_n=32, num_warps=8, num_stages=3, loads="tma_host", gluon=2),
    TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=2, loads="tma_host", dq_mode="matmul", gluon=1),
    TuningParams(block_m=64, block_n=32, num_warps=4, num_stages=3, loads="tma_host", dq_mode="matmul", gluon=1),
    TuningParams(block_m=128, block_n=64, num_warps=8, num_stages=2, loads="tma_host", dq_mode="atomic", gluon=1),
)


def gluon_candidates(space: SearchSpace, spec: KernelSpec, bucket: Bucket) -> list[TuningParams]:
    """The Gluon candidates that ``space`` holds and ``bucket`` can run."""
    if spec.direction == "bwd":
        candidates = GLUON_BWD_CANDIDATES
    else:
        # fp8's own first among them: a short study reaches only the warm start's head (the
        # bucket's own and earlier entries and the neighbours' come before the candidates)
        candidates = (GLUON_FP8_CANDIDATES if spec.fp8 else ()) + GLUON_CANDIDATES
    return [p for p in candidates if prune_reason(space, spec, bucket, p) is None]


def space_for(arch: str, direction: str = "fwd") -> SearchSpace:
    if arch not in SPACES:
        raise ValueError(f"--arch: no search space for {arch!r}; choose from {', '.join(SPACES)}")
    assert arch in ARCHES
    return BWD_SPACES[arch] if direction == "bwd" else SPACES[arch]
