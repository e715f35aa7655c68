"""Per-arch search spaces and the static pruning rules applied before compiling.

A point that fails a rule is never compiled: the study records it as pruned with the
reason, so the sampler learns to avoid it (failed trials would be proposed again).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..generator.arch import ARCHES, fits
from ..generator.spec import KernelSpec, TuningParams, unsupported
from ..store.buckets import Bucket


@dataclass(frozen=True)
class SearchSpace:
    arch: str
    block_m: tuple[int, ...]
    block_n: tuple[int, ...]
    num_warps: tuple[int, ...]
    num_stages: tuple[int, ...]
    loads: tuple[str, ...]
    dq_mode: tuple[str, ...] = ("separate",)  # the backward's; the forward has one choice

    def choices(self) -> dict[str, tuple]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "arch"}

    def size(self) -> int:
        n = 1
        for values in self.choices().values():
            n *= len(values)
        return n

    def contains(self, params: TuningParams) -> bool:
        return all(getattr(params, name) in values for name, values in self.choices().items())


_TILES = (16, 32, 64, 128, 256)
SPACES = {
    # Ampere has cp.async but no tensor descriptors; 164 KB of shared memory on A100 (sm80),
    # about 100 KB on consumer Ampere/Ada (sm86, sm89), where 5 stages never fit a useful tile.
    "sm80": SearchSpace("sm80", _TILES[:4], _TILES[:4], (4, 8), (1, 2, 3, 4, 5), ("pointer",)),
    "sm86": SearchSpace("sm86", _TILES[:4], _TILES[:4], (4, 8), (1, 2, 3, 4), ("pointer",)),
    "sm89": SearchSpace("sm89", _TILES[:4], _TILES[:4], (4, 8), (1, 2, 3, 4), ("pointer",)),
    # Hopper: 228 KB, warp groups of 4 warps, three load paths.
    "sm90": SearchSpace("sm90", _TILES, _TILES[1:], (4, 8), (1, 2, 3, 4), ("pointer", "tma_device", "tma_host")),
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
    # split the rows badly. Every such variant in benchmarks/results/sweep-fwd-h200-fp16.json
    # ran at 40-60% of the best one.
    # (Forward only: the backward's 64-row tiles need 8 warps to hold their accumulators without
    # spilling, benchmarks/results/registers-bwd-sm90.json.)
    if space.arch == "sm90" and spec.direction == "fwd" and params.num_warps == 8 and params.block_m < 128:
        return "8 warps on sm90 need block_m >= 128 (two 64-row warp groups)"
    return None


# The backward: pointer loads or host descriptors (no in-kernel ones), short loop steps down
# to 16 rows, which its register budget favours, and dQ either way. On sm90 also 16 warps:
# the dK/dV kernel's two fp32 accumulators of 128 x D spill at D=128 over 8 warps' registers
# (perf-notes v11), and PyTorch's FlexAttention picks 16 warps for its D=128 backward on
# Hopper (0.77x cuDNN on this H200 in the shared anchors, against our 0.60x).
BWD_SPACES = {
    arch: SearchSpace(arch, _TILES[:4] if arch != "sm90" else _TILES, _TILES[:4], (4, 8, 16) if arch == "sm90" else (4, 8),
                      (1, 2, 3, 4, 5) if arch == "sm90" else (1, 2, 3),
                      ("pointer", "tma_host") if arch == "sm90" else ("pointer",),
                      ("separate", "atomic", "tma_reduce") if arch == "sm90" else ("separate", "atomic"))
    for arch in SPACES
}


def space_for(arch: str, direction: str = "fwd") -> SearchSpace:
    if arch not in SPACES:
        raise ValueError(f"--arch: no search space for {arch!r}; choose from {', '.join(SPACES)}")
    assert arch in ARCHES
    return BWD_SPACES[arch] if direction == "bwd" else SPACES[arch]
