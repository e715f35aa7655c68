"""Per-arch search spaces and the static pruning rules applied before compiling.

A point that fails a rule is never compiled: the study records it as pruned with the
reason, so the sampler learns to avoid it (failed trials would be proposed again).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields, replace

from ..generator.arch import ARCHES, fits
from ..generator.descriptors import direction_templates, template_of
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
    # the templates' own knobs this arch searches, (name, values) (``descriptors.Knob``)
    extra: tuple[tuple[str, tuple], ...] = ()

    def choices(self) -> dict[str, tuple]:
        core = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("arch", "extra")}
        return {**core, **dict(self.extra)}

    def point(self, params: TuningParams) -> dict:
        """``params`` as a study's trial holds it: a value for every knob of the space."""
        return {name: getattr(params, name) for name in self.choices()}

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
    split = params.block_n if spec.direction in ("fwd", "decode") else spec.head_dim_padded
    if params.block_m * split < 256 * params.num_warps:
        return f"{params.block_m}x{split} tile too small for {params.num_warps} warps"
    # Rows past the sequence are pure waste: no tile taller than the bucket needs.
    if spec.direction == "decode":  # the packed rows: new tokens times the GQA group
        rows = bucket.seqlen_q * bucket.group
        if params.block_m > max(16, rows):
            return f"block_m {params.block_m} exceeds the bucket's {rows} packed query rows"
        if params.block_n > max(16, bucket.seqlen_k):
            return f"block_n {params.block_n} exceeds the bucket's key length {bucket.seqlen_k}"
    elif spec.direction == "fwd":
        if params.block_m > max(16, bucket.seqlen_q):
            return f"block_m {params.block_m} exceeds the bucket's query length {bucket.seqlen_q}"
        if params.block_n > max(16, bucket.seqlen_k):
            return f"block_n {params.block_n} exceeds the bucket's key length {bucket.seqlen_k}"
    else:  # the backward's tiles hold queries in one kernel and keys in the other
        longest = max(bucket.seqlen_q, bucket.seqlen_k)
        if max(params.block_m, params.block_n) > max(16, longest):
            return f"{params.block_m}x{params.block_n} tiles exceed the bucket's longest sequence {longest}"
    # then what the variant's template measured slower
    return template_of(spec, params).prune(space.arch, spec, params)


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

# Decoding over a KV cache: pointer loads on the plain grid; tiles of the packed query rows (up to
# 128) by 32 to 128 keys, and the split count (the decode template's knob, whose 0 is the
# heuristic: runtime.defaults.decode_splits).
DECODE_SPACES = {
    arch: SearchSpace(arch, _TILES[:4], _TILES[1:4], (4, 8), (1, 2, 3, 4), ("pointer",)) for arch in SPACES
}

# Knobs whose values are ordered (sizes, counts): a local move goes to the next value either side.
# (persistent is not: one program an SM is the Gluon forward's alone, so that from the plain
# grid a Triton program's only persistent move is two an SM.)
_ORDERED = {"block_m", "block_n", "num_warps", "num_stages"}


def local_moves(space: SearchSpace, params: TuningParams) -> list[TuningParams]:
    """The points of ``space`` one knob away from ``params``: each ordered knob one step
    down and up (tile sizes halved and doubled, one stage fewer and more), every other
    value of the unordered ones. The template's own knobs first: the decode template's split
    count moved its time most (H100, batch 8, 8k keys: 2014 GB/s with one split, 2636 with
    two), and a study of few trials measures its warm starts in order. Then ordered by knob as
    the H200's backward winners differ most from one bucket to the next: loop step, stages,
    load path, warps, then owned rows."""
    order = [name for name, _ in space.extra]
    order += ["block_n", "num_stages", "loads", "num_warps", "block_m", "dq_mode", "persistent", "gluon"]
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


def gluon_candidates(space: SearchSpace, spec: KernelSpec, bucket: Bucket) -> list[TuningParams]:
    """The Gluon candidates that ``space`` holds and ``bucket`` can run."""
    candidates = [p for t in direction_templates(spec.direction) for p in t.candidates(spec)]
    return [p for p in candidates if prune_reason(space, spec, bucket, p) is None]


def space_for(arch: str, direction: str = "fwd", varlen: bool = False) -> SearchSpace:
    """The space ``fa2gen tune`` searches for ``direction`` on ``arch``; ``varlen``: a packed
    batch's, which runs on the plain grid with pointer loads (the forward also in-kernel
    descriptors, in the Triton template and the Gluon one, whose programs may also be
    persistent), dQ in its own kernel or added into fp32 sums (dq_mode atomic)."""
    if arch not in SPACES:
        raise ValueError(f"--arch: no search space for {arch!r}; choose from {', '.join(SPACES)}")
    assert arch in ARCHES
    space = {"bwd": BWD_SPACES, "decode": DECODE_SPACES}.get(direction, SPACES)[arch]
    if varlen:  # the forward's descriptors are built in the kernel, per sequence
        # (the Gluon kernels build their descriptors per sequence, forward and backward)
        hopper = direction in ("fwd", "bwd") and "tma_device" in SPACES[arch].loads
        loads = ("pointer", "tma_device") if hopper else ("pointer",)
        gluon = space.gluon if hopper else (0,)
        # (dQ in its own kernel, or added into fp32 sums by packed row: the one pass at D=64)
        dq_mode = tuple(m for m in space.dq_mode if m in ("separate", "atomic"))
        # (persistent: the Gluon forward's programs on the queue)
        persistent = (0, 1) if hopper and direction == "fwd" else (0,)
        space = replace(space, loads=loads, dq_mode=dq_mode, persistent=persistent, gluon=gluon)
    # with the knobs of the direction's templates that this arch searches
    extra = tuple(
        (k.name, k.searched[arch]) for t in direction_templates(direction) for k in t.knobs if arch in k.searched
    )
    return replace(space, extra=extra) if extra else space
