"""Facts about GPU architectures that decide which variants can run where."""

from __future__ import annotations

from dataclasses import dataclass

from .descriptors import template_of
from .spec import TMA_LOADS, KernelSpec, TuningParams


@dataclass(frozen=True)
class ArchInfo:
    name: str
    smem_bytes: int  # opt-in shared memory per block
    has_tma: bool
    has_fp8: bool  # e4m3 tensor-core matmuls
    has_wgmma: bool = False  # Hopper's warp-group matmuls, which the Gluon forward issues
    max_warps: int = 16
    smem_per_sm: int = 0  # an SM's shared memory, what its resident blocks share


# Every resident block also takes 1 KB of an SM's shared memory for the system (sm80 and later).
BLOCK_RESERVED_SMEM = 1024

ARCHES: dict[str, ArchInfo] = {
    "sm80": ArchInfo("sm80", 163 * 1024, False, False, smem_per_sm=164 * 1024),
    "sm86": ArchInfo("sm86", 99 * 1024, False, False, smem_per_sm=100 * 1024),
    "sm89": ArchInfo("sm89", 99 * 1024, False, True, smem_per_sm=100 * 1024),
    "sm90": ArchInfo("sm90", 227 * 1024, True, True, has_wgmma=True, smem_per_sm=228 * 1024),
}


def arch_from_capability(major: int, minor: int) -> str:
    """Map a compute capability to the nearest arch we have facts for."""
    name = f"sm{major}{minor}"
    if name in ARCHES:
        return name
    if major >= 9:
        return "sm90"
    if major == 8:
        return "sm86" if minor >= 6 else "sm80"
    return name


def smem_estimate(spec: KernelSpec, params: TuningParams) -> int:
    """Shared memory a variant needs, in bytes (an estimate for pruning): its template's count
    (``descriptors``: the Q, K and V tiles, rings and staged tiles each template holds)."""
    return template_of(spec, params).smem(spec, params)


def fits(spec: KernelSpec, params: TuningParams, arch: str) -> str | None:
    """None if the variant is plausible on ``arch``, else the reason it is not."""
    info = ARCHES.get(arch)
    if info is None:
        return f"unknown arch {arch!r}"
    if params.gluon and not info.has_wgmma:
        return f"the Gluon kernels issue Hopper's wgmma; {arch} has none"
    if params.loads in TMA_LOADS and not info.has_tma:
        return f"tma loads need sm90+, {arch} has none"
    if spec.fp8 and not info.has_fp8:
        return f"{spec.dtype} needs fp8 tensor cores (sm89+), {arch} has none"
    if params.num_warps > info.max_warps:
        return f"num_warps {params.num_warps} > {info.max_warps}"
    need = smem_estimate(spec, params)
    if need > info.smem_bytes:
        return f"shared memory {need} B > {info.smem_bytes} B on {arch}"
    # Three programs an SM is a launch sized for all three to be resident (its registers): a
    # third that does not fit in shared memory runs as a second wave instead.
    if params.persistent == 3 and 3 * (need + BLOCK_RESERVED_SMEM) > info.smem_per_sm:
        return (
            f"three programs an SM need 3 x {need + BLOCK_RESERVED_SMEM} B of shared memory > "
            f"{info.smem_per_sm} B on {arch}"
        )
    return None
