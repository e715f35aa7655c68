"""What a template descriptor declares: one Jinja template's contract in Python."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..spec import KernelSpec, TuningParams


@dataclass(frozen=True)
class Kernel:
    """One kernel of a rendered module: its name, the constexpr values a launch binds, and a
    Triton kernel's launch options (None: a Gluon kernel's, its module's ``LAUNCH``).
    ``boxes``: the 4-D box of each host descriptor it takes, by argument, in argument order
    (a Triton kernel takes them with loads=tma_host).
    ``replaces``: the kernel of the Triton template it stands in for (the Gluon backward's)."""

    name: str
    constexprs: dict[str, int] = field(default_factory=dict)
    options: dict[str, int] | None = None
    boxes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    replaces: str = ""


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
    def qkvo_boxes(spec: KernelSpec, q_rows: int, kv_rows: int, cols: int) -> dict[str, tuple[int, ...]]:
        """The Q, K, V and O descriptors' boxes; fp8's V is transposed, (B, H, D, N), so its box
        is (D x keys)."""
        v = (1, 1, cols, kv_rows) if spec.fp8 else (1, 1, kv_rows, cols)
        return {"Q": (1, 1, q_rows, cols), "K": (1, 1, kv_rows, cols), "V": v, "O": (1, 1, q_rows, cols)}

    def unsupported(self, spec: KernelSpec, params: TuningParams) -> str | None:
        if params.dq_mode != "separate":
            return "dq_mode is a backward knob; the forward takes the default 'separate'"
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
    def owned_and_streamed(spec: KernelSpec, params: TuningParams) -> int:
        dp, elt = spec.head_dim_padded, spec.element_bytes
        return 2 * params.block_m * dp * elt + 2 * max(1, params.num_stages) * params.block_n * dp * elt

    def unsupported(self, spec: KernelSpec, params: TuningParams) -> str | None:
        if params.loads == "tma_device":
            return "the backward template has pointer loads and host descriptors, not in-kernel descriptors"
        if params.persistent:
            return "persistent is a forward knob; the backward takes the default 0"
        if params.dq_mode == "matmul" and params.gluon != 1:
            return "dq_mode matmul takes dS from the Gluon dK/dV kernel: it needs gluon=1"
        if params.dq_mode == "tma_reduce" and params.loads != "tma_host":
            return "dq_mode tma_reduce adds through a host tensor descriptor: it needs loads=tma_host"
        return None
