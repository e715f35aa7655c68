"""Facts about GPU architectures that decide which variants can run where."""

from __future__ import annotations

from dataclasses import dataclass

from .spec import TMA_LOADS, KernelSpec, TuningParams, gluon_overlap


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


def gluon_k_stages(spec: KernelSpec, params: TuningParams) -> int:
    """K's ring depth in the Gluon forward: one slot fewer than V's with the overlapped softmax,
    whose K slots go back a step before V's, else num_stages."""
    return params.num_stages - 1 if gluon_overlap(spec, params) else params.num_stages


def smem_estimate(spec: KernelSpec, params: TuningParams) -> int:
    """Shared memory a variant needs, in bytes (an estimate for pruning).

    Forward: Q stays resident (two slots in a persistent Gluon program); K and V are buffered
    ``num_stages`` deep (K one slot less in the Gluon forms with the overlapped softmax); on the
    pointer path the probability tile P is staged through shared memory for the second dot.
    Backward (both kernels): two resident tiles of the owned rows (K and V, or Q and
    dO), two streamed tiles buffered ``num_stages`` deep, and the P and dS tiles; with
    ``dq_mode="tma_reduce"`` also the fp32 dQ tile staged for its bulk reduction, with
    ``dq_mode="matmul"`` two dS tiles staged for their stores. The Gluon one pass
    (``dq_mode="atomic"``, gluon=1) also holds two dS^T tiles of all its keys for its dQ
    matmul and an fp32 scratch tile of dQ for the adds.
    """
    elt = spec.element_bytes
    dp = spec.head_dim_padded
    stages = max(1, params.num_stages)
    if spec.direction == "bwd":
        resident = 2 * params.block_m * dp * elt
        streamed = 2 * stages * params.block_n * dp * elt
        if params.gluon:  # the Gluon dK/dV kernel keeps P and dS in registers (dq_mode matmul:
            # and stages dS for its store, two tiles deep; the one pass shares it, two deep)
            staged_ds = 2 * params.block_m * params.block_n * elt if params.dq_mode in ("matmul", "atomic") else 0
            scratch = params.block_n * dp * 4 if params.dq_mode == "atomic" else 0
            return resident + streamed + staged_ds + scratch
        staged_dq = params.block_n * dp * 4 if params.dq_mode == "tma_reduce" else 0
        return resident + streamed + 2 * params.block_m * params.block_n * elt + staged_dq
    q = params.block_m * dp * elt
    k_stages = gluon_k_stages(spec, params) if params.gluon else stages
    kv = (k_stages + stages) * params.block_n * dp * elt
    p = params.block_m * params.block_n * elt if params.loads == "pointer" else 0
    if params.gluon and params.persistent:
        q *= 2  # two Q slots: the next tile's Q lands while this tile runs
    # the Gluon forward's own O buffer for fp8 (bf16, twice Q's size); 16-bit O goes through Q's
    o = params.block_m * dp * 2 if params.gluon and spec.fp8 else 0
    return q + kv + p + o


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
