"""What a template descriptor declares: one Jinja template's contract in Python."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..spec import KernelSpec, TuningParams

# What a launch passes for each kind of argument (``Arg.kind``).
ARG_KINDS = ("tensor", "stride", "int", "float")
# A tensor argument's element type (``Arg.dtype``): the inputs', the output's (bf16 for fp8),
# fp32 (LSE, delta, dQ's sums, fp8's factors), int32 (the tile counter, offsets) or int64
# (dropout's seed).
TENSOR_TYPES = ("in", "out", "fp32", "i32", "i64")


@dataclass(frozen=True)
class Arg:
    """One runtime argument of a kernel, named as its template names it, with what a launch
    passes for it: a tensor (``kind`` "tensor", by its name; a host descriptor over it where
    the kernel's ``boxes`` name it), one of a tensor's strides ("stride": dim ``dim`` of the
    tensor ``of``), or a number ("int", "float": a value of the call, by its name)."""

    name: str
    kind: str
    dtype: str = ""  # a tensor's element type, one of TENSOR_TYPES
    of: str = ""
    dim: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ARG_KINDS or (self.kind == "tensor") != (self.dtype in TENSOR_TYPES):
            raise ValueError(f"argument {self.name}: kind {self.kind!r} with dtype {self.dtype!r}")


def tensors(names: str, dtype: str = "in") -> tuple[Arg, ...]:
    """Tensor arguments (space-separated names) of one element type."""
    return tuple(Arg(n, "tensor", dtype) for n in names.split())


def strides(tensor: str, names: str) -> tuple[Arg, ...]:
    """The batch, head and row strides of ``tensor``, under the template's three names."""
    return tuple(Arg(n, "stride", of=tensor, dim=i) for i, n in enumerate(names.split()))


def packed_args(names: str, query_rows: str = "") -> tuple[Arg, ...]:
    """A packed batch's tensors' head and row strides (dims 1 and 2 of
    ``runtime.varlen.batch_view``: stride_qh, stride_qn, ...; a row stride ends in m for the
    tensors named in ``query_rows``), then the sequences' offsets CU_Q and CU_K: what a kernel
    that builds each sequence's descriptors takes in place of host descriptors."""
    args: tuple[Arg, ...] = ()
    for t in names.split():
        row = f"stride_{t.lower()}{'m' if t in query_rows.split() else 'n'}"
        args += (Arg(f"stride_{t.lower()}h", "stride", of=t, dim=1), Arg(row, "stride", of=t, dim=2))
    return args + tensors("CU_Q CU_K", "i32")


def alibi_args(spec: KernelSpec) -> tuple[Arg, ...]:
    """ALiBi's slopes (fp32, one per query head, its batch stride 0 when shared by the batch)
    where the spec has them: a kernel's last runtime arguments."""
    return tensors("ALIBI", "fp32") + ints("stride_ab") if spec.alibi else ()


def dropout_args(spec: KernelSpec) -> tuple[Arg, ...]:
    """Dropout's seed (one int64 on the device, drawn per call from torch's generator, so that
    a launch's arguments do not change from call to call) and probability where the spec
    drops: after ALiBi's."""
    return tensors("SEED", "i64") + floats("dropout_p") if spec.dropout else ()


def ints(names: str) -> tuple[Arg, ...]:
    return tuple(Arg(n, "int") for n in names.split())


def floats(names: str) -> tuple[Arg, ...]:
    return tuple(Arg(n, "float") for n in names.split())


@dataclass(frozen=True)
class Kernel:
    """One kernel of a rendered module: its name, its runtime arguments in the kernel's order
    (``args``), the constexpr values a launch binds, and a Triton kernel's launch options
    (None: a Gluon kernel's, its module's ``LAUNCH``).
    ``boxes``: the 4-D box of each tensor argument it takes as a host descriptor, by name, in
    argument order.
    ``replaces``: the kernel of the Triton template it stands in for (the Gluon backward's)."""

    name: str
    args: tuple[Arg, ...] = ()
    constexprs: dict[str, int] = field(default_factory=dict)
    options: dict[str, int] | None = None
    boxes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    replaces: str = ""

    def element(self, spec: KernelSpec, name: str) -> str:
        """The element type of tensor argument ``name`` for ``spec`` ("fp16", "fp32", ...)."""
        dtype = next(a.dtype for a in self.args if a.name == name)
        return {"in": spec.dtype, "out": spec.out_dtype}.get(dtype, dtype)


@dataclass(frozen=True)
class Knob:
    """A tuning knob one template reads beyond TuningParams' own fields: its values, its
    default (what every variant without it renders as), what it does, and the values the tuner
    searches on each arch (none listed: only the default). A template declares its knobs in
    ``knobs``; ``TuningParams`` then takes, validates, stores, labels and loads them
    (``spec.TuningParams.extra``), the tuner's space searches them and ``fa2gen generate``
    takes them (``--knob NAME=VALUE``), with no other change."""

    name: str
    values: tuple
    default: Any
    help: str
    searched: dict[str, tuple] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.default not in self.values:
            raise ValueError(f"knob {self.name}: default {self.default!r} is not one of {self.values}")


class Template:
    """One Jinja template: the variants it renders (its direction and ``TuningParams.gluon``
    values), the rules that say which specs and params it renders, the Jinja variables it
    reads and how they derive from the spec and params, its kernels, the shared memory a
    variant holds, and what the tuner enqueues and prunes of it.

    ``triton`` is the (major, minor) of the Triton the code is for (None: the installed); a
    template's text may differ by version only through a flag here."""

    file: ClassVar[str]
    direction: ClassVar[str]
    gluon: ClassVar[tuple[int, ...]]
    knobs: ClassVar[tuple[Knob, ...]] = ()

    def flags(self, spec: KernelSpec, params: TuningParams, triton: tuple[int, int] | None) -> dict[str, Any]:
        """The template's Jinja variables beyond ``name``, ``spec_repr`` and ``params``."""
        return {}

    def variables(
        self, spec: KernelSpec, params: TuningParams, name: str, triton: tuple[int, int] | None = None
    ) -> dict[str, Any]:
        """Everything the template reads: the module's name, the validated spec as a safe Python
        literal, the params, and the flags."""
        return {"name": name, "spec_repr": repr(spec.to_dict()), "params": params, **self.flags(spec, params, triton)}

    def unsupported(self, spec: KernelSpec, params: TuningParams) -> str | None:
        """Why the template cannot render ``params`` for ``spec``, or None."""
        return None

    def kernels(self, spec: KernelSpec, params: TuningParams) -> tuple[Kernel, ...]:
        """The kernels of the module ``params`` render to, in the order a variant runs them."""
        raise NotImplementedError(f"{type(self).__name__} does not list its kernels")

    def candidates(self, spec: KernelSpec) -> tuple[TuningParams, ...]:
        """Points of this template every study enqueues (those the bucket can run), since a
        sampler alone rarely proposes a valid one."""
        return ()

    def prune(self, arch: str, spec: KernelSpec, params: TuningParams) -> str | None:
        """Why the tuner should not compile a point it could render: what measured slower."""
        return None

    def smem(self, spec: KernelSpec, params: TuningParams) -> int:
        """Shared memory a variant holds, in bytes (an estimate for pruning)."""
        raise NotImplementedError(f"{type(self).__name__} does not estimate its shared memory")


class ForwardTemplate(Template):
    """The rules every forward template shares: the backward's knob at its default, the three
    programs an SM only where the Gluon forward runs them, and fp8's matmul shapes. Q stays
    resident in shared memory; K and V stream through it ``num_stages`` deep."""

    direction = "fwd"

    @staticmethod
    def tile_bytes(spec: KernelSpec, rows: int) -> int:
        return rows * spec.head_dim_padded * spec.element_bytes

    @staticmethod
    def io_args(spec: KernelSpec) -> tuple[Arg, ...]:
        """Q, K, V, O and LSE, then fp8's descaling factors: every forward kernel's first
        arguments."""
        args = tensors("Q K V") + tensors("O", "out") + tensors("LSE", "fp32")
        return args + tensors("DESCALE_Q DESCALE_K DESCALE_V", "fp32") if spec.fp8 else args

    @staticmethod
    def descale_strides(spec: KernelSpec) -> tuple[Arg, ...]:
        """fp8's factors' batch and head strides (0 where a factor is per tensor)."""
        return ints("stride_dsq_b stride_dsq_h stride_dsk_b stride_dsk_h stride_dsv_b stride_dsv_h") if spec.fp8 else ()

    @staticmethod
    def qkvo_boxes(spec: KernelSpec, q_rows: int, kv_rows: int, cols: int) -> dict[str, tuple[int, ...]]:
        """The Q, K, V and O descriptors' boxes; fp8's V is transposed, (B, H, D, N), so its box
        is (D x keys)."""
        v = (1, 1, cols, kv_rows) if spec.fp8 else (1, 1, kv_rows, cols)
        return {"Q": (1, 1, q_rows, cols), "K": (1, 1, kv_rows, cols), "V": v, "O": (1, 1, q_rows, cols)}

    def unsupported(self, spec: KernelSpec, params: TuningParams) -> str | None:
        if params.dq_mode != "separate":
            return "dq_mode is a backward knob; the forward takes the default 'separate'"
        if spec.varlen and (params.loads == "tma_host" or (params.persistent and not params.gluon)):
            # (a host descriptor spans the whole packed tensor: its boxes would cross into the
            # next sequence; in-kernel ones are built per sequence and stop at its end. The
            # Gluon forward's persistent programs take tiles from a queue and build them per tile.)
            return (
                "packed batches (varlen) run with pointer loads or in-kernel descriptors, on the plain grid "
                "(persistent: the Gluon forward only)"
            )
        if (spec.alibi or spec.dropout) and params.gluon:
            return "ALiBi and dropout run in the Triton template (gluon=0)"
        if params.persistent == 3 and (params.gluon != 1 or params.block_m != 64):
            return (
                "persistent=3 is the Gluon forward's one 64-row partition (gluon=1, block_m=64), whose launch "
                "gives three programs an SM's registers"
            )
        # fp8 tensor-core matmuls reduce over at least 32 elements: keys in P @ V, the head in Q @ K^T
        if spec.fp8 and params.block_n < 32:
            return "fp8 needs block_n >= 32 (its P @ V matmul reduces over 32 keys at a time)"
        if spec.fp8 and spec.head_dim_padded < 32:
            return "fp8 needs head_dim > 16 (its Q @ K^T matmul reduces over 32 columns at a time)"
        return None


class BackwardTemplate(Template):
    """The rules every backward template shares: no in-kernel descriptors, the forward's knob
    at its default, and the dQ modes' needs. Both of its matmul kernels keep two tiles of the
    rows they own resident (K and V, or Q and dO) and stream two tiles ``num_stages`` deep."""

    direction = "bwd"

    @staticmethod
    def sizes(heads: str) -> tuple[Arg, ...]:
        """The sizes and scale every backward matmul kernel takes after its tensors (and
        strides); ``heads``: the heads its grid counts (Hq or Hkv)."""
        return ints(f"{heads} group Nq Nk") + floats("sm_scale")

    @staticmethod
    def owned_and_streamed(spec: KernelSpec, params: TuningParams) -> int:
        dp, elt = spec.head_dim_padded, spec.element_bytes
        return 2 * params.block_m * dp * elt + 2 * max(1, params.num_stages) * params.block_n * dp * elt

    def unsupported(self, spec: KernelSpec, params: TuningParams) -> str | None:
        if params.loads == "tma_device" and not (spec.varlen and params.gluon):
            return "the backward takes in-kernel descriptors in the Gluon kernels of a packed batch only"
        if params.persistent:
            return "persistent is a forward knob; the backward takes the default 0"
        packed_loads = "tma_device" if params.gluon else "pointer"
        if spec.varlen and (params.loads != packed_loads or params.dq_mode not in ("separate", "atomic")):
            return (
                "packed batches (varlen) run the Triton template's pointer loads or the Gluon kernels' in-kernel "
                "descriptors, dQ in its own kernel or added into fp32 sums (dq_mode separate or atomic)"
            )
        if (spec.alibi or spec.dropout) and params.gluon:
            return "ALiBi and dropout run in the Triton template (gluon=0)"
        if params.dq_mode == "matmul" and params.gluon != 1:
            return "dq_mode matmul takes dS from the Gluon dK/dV kernel: it needs gluon=1"
        if params.dq_mode == "tma_reduce" and params.loads != "tma_host":
            return "dq_mode tma_reduce adds through a host tensor descriptor: it needs loads=tma_host"
        return None
