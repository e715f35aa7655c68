"""What a kernel computes (KernelSpec) and how it is tiled (TuningParams).

Both are frozen dataclasses whose every field is checked against an allowed set
on construction, so a value read from YAML, a database or the command line can
never reach a template unvalidated. Names, digests and cache files are derived
from the fields mechanically (see ``identity.py``); nothing here is hand-named.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, fields
from typing import Any, Mapping

DIRECTIONS = ("fwd", "bwd", "decode")
DTYPES = ("fp16", "bf16", "fp8e4m3")
FP8_DTYPES = ("fp8e4m3",)  # forward only: e4m3 inputs with descaling factors, bf16 output
MASKS = ("none", "causal", "local")
LOADS = ("pointer", "tma_device", "tma_host")
TMA_LOADS = ("tma_device", "tma_host")
DQ_MODES = ("separate", "atomic", "tma_reduce", "matmul")
HEAD_DIMS = tuple(range(16, 257, 8))
BLOCK_SIZES = (16, 32, 64, 128, 256)
NUM_WARPS = (1, 2, 4, 8, 16)
NUM_STAGES = (1, 2, 3, 4, 5)
PERSISTENT = (0, 1, 2, 3)  # programs per SM of a persistent forward grid; 0: one program per tile
GLUON = (0, 1, 2)  # compute partitions of the Gluon forward; 0: the Triton template
GLUON_HEAD_DIMS = (64, 128)
GLUON_TILES = (64, 128)


class SpecError(ValueError):
    """A spec or tuning parameter outside its allowed set."""


def _check_choice(cls_name: str, name: str, value: Any, allowed: tuple) -> None:
    # bool is an int subclass: reject it explicitly so True never passes for 1.
    if isinstance(value, bool) and not all(isinstance(a, bool) for a in allowed):
        raise SpecError(f"{cls_name}.{name}: expected one of {allowed}, got {value!r}")
    if value not in allowed or type(value) is not type(allowed[0]):
        raise SpecError(f"{cls_name}.{name}: expected one of {allowed}, got {value!r}")


def next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


@dataclass(frozen=True)
class KernelSpec:
    """The function a generated kernel computes.

    direction: "fwd", "bwd" (the three backward kernels: delta, dK/dV, dQ), or "decode"
        (attention over a KV cache, its keys split across programs: ``attention_with_kvcache``).
    dtype: element type of q/k/v: "fp16" or "bf16" (o in the same type), or "fp8e4m3"
        (forward only: q, k, v in e4m3 with per-tensor or per-head descaling factors, V
        staged transposed, P rounded to e4m3 for its matmul, o in bf16).
    head_dim: D, any multiple of 8 in [16, 256]; padded to a power of two inside.
    mask: "none", "causal" (bottom-right aligned) or "local" (sliding window whose
        left/right extents are runtime arguments; causal+window is "local" with right=0).
    softcap: whether scores pass through softcap*tanh(s/softcap).
    varlen: whether q, k and v hold a packed batch of sequences of their own lengths
        (``cu_seqlens``): each sequence attends to its own keys only. fp16 and bf16.
    paged (decode only): whether the KV cache is pages that a block table maps per sequence.
    alibi: whether each score gets ALiBi's bias, -slope * |j - (i + Nk - Nq)|, one slope per
        query head (or per batch and query head), given at run time. fp16 and bf16, the Triton
        templates.
    dropout: whether the probabilities pass through dropout (``dropout_p`` and a Philox seed at
        run time; the backward draws the forward's mask again). fp16 and bf16, the Triton
        forward and backward templates.
    """

    direction: str = "fwd"
    dtype: str = "fp16"
    head_dim: int = 64
    mask: str = "none"
    softcap: bool = False
    varlen: bool = False
    paged: bool = False
    alibi: bool = False
    dropout: bool = False

    def __post_init__(self) -> None:
        _check_choice("KernelSpec", "direction", self.direction, DIRECTIONS)
        _check_choice("KernelSpec", "dtype", self.dtype, DTYPES)
        _check_choice("KernelSpec", "head_dim", self.head_dim, HEAD_DIMS)
        _check_choice("KernelSpec", "mask", self.mask, MASKS)
        _check_choice("KernelSpec", "softcap", self.softcap, (False, True))
        _check_choice("KernelSpec", "varlen", self.varlen, (False, True))
        _check_choice("KernelSpec", "paged", self.paged, (False, True))
        _check_choice("KernelSpec", "alibi", self.alibi, (False, True))
        _check_choice("KernelSpec", "dropout", self.dropout, (False, True))
        if self.dropout and (self.dtype in FP8_DTYPES or self.direction == "decode"):
            raise SpecError("KernelSpec.dropout: dropout takes fp16 or bf16, forward and backward (not decode)")
        if self.alibi and self.dtype in FP8_DTYPES:
            raise SpecError("KernelSpec.alibi: ALiBi takes fp16 or bf16")
        if self.paged and self.direction != "decode":
            raise SpecError("KernelSpec.paged: a paged KV cache is the decode direction's")
        if self.direction == "decode" and (self.varlen or self.dtype in FP8_DTYPES):
            raise SpecError("KernelSpec: decode takes fp16 or bf16 caches of fixed-length batches (no varlen)")
        if self.varlen and self.dtype in FP8_DTYPES:
            raise SpecError("KernelSpec.varlen: packed batches take fp16 or bf16")
        if self.dtype in FP8_DTYPES and self.direction != "fwd":
            raise SpecError(f"KernelSpec.dtype: {self.dtype} is forward only; the backward takes fp16 or bf16")

    @property
    def fp8(self) -> bool:
        return self.dtype in FP8_DTYPES

    @property
    def out_dtype(self) -> str:
        """Element type of the output: bf16 for fp8 inputs, else the inputs' own."""
        return "bf16" if self.fp8 else self.dtype

    @property
    def element_bytes(self) -> int:
        return 1 if self.fp8 else 2

    @property
    def head_dim_padded(self) -> int:
        return max(16, next_pow2(self.head_dim))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "KernelSpec":
        return _from_dict(cls, data)

    def to_dict(self) -> dict:
        # varlen, paged, alibi and dropout only where set: every other spec's dict, and so its
        # rendered code, as before
        d = dataclasses.asdict(self)
        for flag in ("varlen", "paged", "alibi", "dropout"):
            if not d[flag]:
                del d[flag]
        return d


@dataclass(frozen=True)
class TuningParams:
    """How a kernel is tiled and scheduled; any valid point computes the same result.

    Forward: block_m query rows per program, block_n key rows per loop step. Backward:
    block_m rows a program owns (keys in the dK/dV kernel, queries in the dQ kernel),
    block_n rows its loop steps through.

    loads: "pointer" (masked pointer loads, any arch, any alignment), or tensor
        descriptors (sm90+, 16-byte aligned bases and strides) built in the kernel
        ("tma_device", which needs a Triton allocator for their scratch) or on the
        host ("tma_host", which costs a descriptor encode per tensor per launch).
    dq_mode (backward only): "separate" computes dQ in its own kernel, which recomputes the
        scores (no atomics, bit-identical across runs); "atomic" adds dQ from the dK/dV
        kernel into an fp32 buffer with atomics (two matmuls fewer, order not fixed; with
        gluon=1, the Hopper one pass, by the TMA's bulk reductions);
        "tma_reduce" does the same with one bulk reduction per tile through a host
        descriptor (sm90+, with loads="tma_host"); "matmul" (gluon=1) has the Gluon dK/dV
        kernel store each step's dS tile, and a Gluon kernel of its own then computes dQ = dS
        K over it, nothing computed twice, at the cost of a scratch of 2 * Nq * Nk bytes per
        query head (the backward runs in chunks of batches or heads that bound it).
    persistent (forward only): 0 launches one program per (query block, batch * head) tile;
        1, 2 or 3 launch that many programs per SM, each walking tiles in turn, the heaviest
        causal tiles of every head first. 3 is the Gluon forward's one 64-row partition only
        (gluon=1, block_m=64), launched with 80 registers a thread so that three programs
        share an SM's registers; where their shared memory does not fit too, the arch rules
        it out (``arch.fits``).
    gluon (sm90): 0 renders the Triton template. Forward: 1 or 2 render the Gluon
        template, a warp-specialised kernel: one loader warp streams K and V through the TMA
        into a ring of num_stages slots while the compute warps (block_m // 16, 16 query rows
        each) run the matmuls and the softmax. With 2, each 64-row warp group is a partition
        of its own and hands ring slots back on its own, so one group's softmax can run while
        the other's matmuls occupy the tensor cores. It reads through host descriptors
        (loads="tma_host"), for fp16, bf16 and fp8, head dims 64 and 128, no mask or causal;
        with persistent > 0 its programs walk tiles, each loader fetching the next tile while
        its compute partitions finish the last one. Backward: 1 writes the dK/dV kernel in
        Gluon (its matmuls overlapped with the exponentials and dS); delta and dQ stay the
        Triton template's, with the same tiles, but for dq_mode matmul (dQ by a Gluon kernel
        over the dS the dK/dV kernel stores) and atomic (the one pass: two compute warp groups
        and a third that computes dQ and adds it, 12 warps whatever num_warps says; only the
        pass that scales and casts dQ's sums is Triton's). 2 writes the dQ kernel in Gluon as well
        (block_m queries a program, block_n keys a step; the exponentials under dP's matmul,
        each step's dQ matmul under the next step's loads).
    """

    block_m: int = 64
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    loads: str = "pointer"
    dq_mode: str = "separate"
    persistent: int = 0
    gluon: int = 0
    # The knobs a template declares beyond these (``descriptors.Knob``), as sorted (name,
    # value) pairs, those at their default left out: read as attributes (``params.name``),
    # written as keys of their own by ``to_dict``.
    extra: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        _check_choice("TuningParams", "block_m", self.block_m, BLOCK_SIZES)
        _check_choice("TuningParams", "block_n", self.block_n, BLOCK_SIZES)
        _check_choice("TuningParams", "num_warps", self.num_warps, NUM_WARPS)
        _check_choice("TuningParams", "num_stages", self.num_stages, NUM_STAGES)
        _check_choice("TuningParams", "loads", self.loads, LOADS)
        _check_choice("TuningParams", "dq_mode", self.dq_mode, DQ_MODES)
        _check_choice("TuningParams", "persistent", self.persistent, PERSISTENT)
        _check_choice("TuningParams", "gluon", self.gluon, GLUON)
        if self.extra:
            object.__setattr__(self, "extra", _checked_extra(self.extra))

    def __getattr__(self, name: str) -> Any:
        # (only for names that are not fields: a template's own knobs)
        if name.startswith("_"):
            raise AttributeError(name)
        knob = _knobs().get(name)
        if knob is None:
            raise AttributeError(f"TuningParams has no knob {name!r}")
        return dict(self.extra).get(name, knob[0].default)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TuningParams":
        if isinstance(data, Mapping):
            if "extra" in data:  # (a file names each knob itself)
                raise SpecError("TuningParams: unknown field(s) ['extra']")
            extra = tuple((k, v) for k, v in data.items() if k not in _PARAM_FIELDS)
            if extra and all(isinstance(k, str) and k in _knobs() for k, _ in extra):
                data = {**{k: v for k, v in data.items() if k in _PARAM_FIELDS}, "extra": extra}
        return _from_dict(cls, data)

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        del data["extra"]
        return {**data, **dict(self.extra)}

    def replace(self, **changes: Any) -> "TuningParams":
        knobs = {k: v for k, v in changes.items() if k not in _PARAM_FIELDS}
        if knobs:
            changes = {k: v for k, v in changes.items() if k in _PARAM_FIELDS}
            changes["extra"] = tuple({**dict(self.extra), **knobs}.items())
        return dataclasses.replace(self, **changes)

    def label(self) -> str:
        """Short form for tables: "m128 n32 w8 s3 pointer", plus " dq-atomic", " persistent2"
        or " gluon2" (say) when set, and a template knob off its default as " name=value"."""
        text = f"m{self.block_m} n{self.block_n} w{self.num_warps} s{self.num_stages} {self.loads}"
        text += "" if self.dq_mode == "separate" else f" dq-{self.dq_mode}"
        text += f" persistent{self.persistent}" if self.persistent else ""
        text += f" gluon{self.gluon}" if self.gluon else ""
        return text + "".join(f" {k}={v}" for k, v in self.extra)


_PARAM_FIELDS = frozenset(f.name for f in fields(TuningParams))


def _knobs() -> dict:
    from .descriptors import template_knobs  # the descriptors build on this module

    return template_knobs()


def _checked_extra(extra) -> tuple[tuple[str, Any], ...]:
    """``extra`` as TuningParams keeps it: each a declared knob with one of its values, sorted,
    those at their default dropped."""
    knobs = _knobs()
    try:
        pairs = dict(extra)
    except (TypeError, ValueError):
        raise SpecError(f"TuningParams.extra: expected (name, value) pairs, got {extra!r:.80}") from None
    kept = []
    for name, value in sorted(pairs.items(), key=lambda kv: str(kv[0])):
        if name not in knobs:
            raise SpecError(f"TuningParams: unknown knob {name!r}; templates declare {sorted(knobs)}")
        knob = knobs[name][0]
        _check_choice("TuningParams", name, value, knob.values)
        if value != knob.default:
            kept.append((name, value))
    return tuple(kept)


# The backward's memory-bound passes (delta = rowsum(dO * O), and the atomic path's dQ
# store) take their own small tiles: at the matmul kernels' 128 rows they held 2 x 128 x D
# values per 128 threads, which starves a pass that only streams memory of occupancy.
# 2048 elements per 4-warp program: 32 registers (ptxas for sm90, benchmarks/registers.py).
PASS_WARPS = 4


def pass_rows(spec: KernelSpec) -> int:
    return max(8, 2048 // spec.head_dim_padded)


def _from_dict(cls, data: Mapping[str, Any]):
    if not isinstance(data, Mapping):
        raise SpecError(f"{cls.__name__}: expected a mapping, got {type(data).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise SpecError(f"{cls.__name__}: unknown field(s) {sorted(map(str, unknown))}")
    return cls(**dict(data))


def unsupported(spec: KernelSpec, params: TuningParams) -> str | None:
    """Why ``params`` cannot render for ``spec`` at all (on any arch), or None: the rules of the
    template that would render it (``descriptors``)."""
    from .descriptors import template_knobs, template_of  # the descriptors build on this module

    template = template_of(spec, params)
    if template is None:
        return f"no {spec.direction} template renders gluon={params.gluon}"
    if params.extra:  # a knob off its default is its own template's alone
        knobs = template_knobs()
        for name, _ in params.extra:
            if knobs[name][1] is not template:
                return f"knob {name} is read by {knobs[name][1].file} only, not by {template.file}"
    return template.unsupported(spec, params)


def triton_part(params: TuningParams) -> TuningParams:
    """The Triton template's params for the kernels a Gluon backward variant leaves to it, on
    the same tiles: delta, and dQ's kernel, or with the one pass (dq_mode atomic) the pass
    that scales and casts its sums."""
    # (the Gluon template's own knobs stay with it; a packed batch's Gluon kernels build their
    # descriptors in the kernel, and the Triton template's take pointers there)
    loads = "pointer" if params.loads == "tma_device" else params.loads
    return params.replace(
        gluon=0, dq_mode="atomic" if params.dq_mode == "atomic" else "separate", loads=loads, extra=()
    )


def param_space(spec: KernelSpec) -> list[TuningParams]:
    """Every TuningParams point that renders for ``spec``. Which of them suit an arch is
    the tuner's business (``fa2gen.tuner.space``)."""
    points = [
        TuningParams(block_m=bm, block_n=bn, num_warps=w, num_stages=s, loads=ld, dq_mode=dq, persistent=ps, gluon=g)
        for bm in BLOCK_SIZES
        for bn in BLOCK_SIZES
        for w in NUM_WARPS
        for s in NUM_STAGES
        for ld in LOADS
        for dq in DQ_MODES
        for ps in PERSISTENT
        for g in GLUON
    ]
    knobs = _knobs()
    if knobs:  # and each template's own knobs, at every value, on its points
        from .descriptors import template_of

        points = [
            p.replace(**dict(values))
            for p in points
            for values in itertools.product(
                *([(k.name, v) for v in k.values] for k, t in knobs.values() if t is template_of(spec, p))
            )
        ]
    return [p for p in points if unsupported(spec, p) is None]
