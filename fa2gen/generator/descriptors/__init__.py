"""One descriptor per template: each owns its template's contract in Python (the variants it
renders, the rules for which specs and params it renders, its Jinja variables, its kernels with
their arguments, constexprs, options and descriptor boxes, its shared memory, and the tuner's
candidates and prunes).
spec.unsupported, rendering, identity, arch.smem_estimate, ahead, both directions' launches and
tuner.space ask the descriptor of a variant's template (``template_of``, ``parts``, ``plan``)
rather than knowing the templates themselves: a launch binds each kernel's arguments by name
(``runtime.binding``), and an ahead-of-time compile types them from the same list."""

from __future__ import annotations

from ..spec import KernelSpec, TuningParams, triton_part
from .attn_bwd import AttnBwd
from .attn_bwd_gluon import AttnBwdGluon
from .attn_decode import AttnDecode
from .attn_fwd import AttnFwd
from .attn_fwd_gluon import AttnFwdGluon
from .base import Arg, Kernel, Knob, Template

TEMPLATES: tuple[Template, ...] = (AttnFwd(), AttnBwd(), AttnFwdGluon(), AttnBwdGluon(), AttnDecode())
_BY_VARIANT = {(t.direction, g): t for t in TEMPLATES for g in t.gluon}


def template_of(spec: KernelSpec, params: TuningParams) -> Template | None:
    """The template that renders ``params`` for ``spec``, or None where none does (the decode
    direction has no Gluon template)."""
    return _BY_VARIANT.get((spec.direction, params.gluon))


def direction_templates(direction: str) -> tuple[Template, ...]:
    """A direction's templates, its Triton one first."""
    return tuple(t for t in TEMPLATES if t.direction == direction)


def parts(spec: KernelSpec, params: TuningParams) -> tuple[tuple[Template, TuningParams], ...]:
    """The modules a variant runs, as (template, the params it renders): its own, and for the
    Gluon backward the Triton template's on the same tiles (delta, and dQ's kernel or pass:
    ``spec.triton_part``)."""
    own = (template_of(spec, params), params)
    if spec.direction == "bwd" and params.gluon:
        part = triton_part(params)
        return (own, (template_of(spec, part), part))
    return (own,)


def plan(spec: KernelSpec, params: TuningParams) -> tuple[tuple[TuningParams, Kernel], ...]:
    """Every kernel a variant runs, with the params of the module it comes from: the other
    modules' kernels first (less those the variant's own replace), then its own."""
    (template, own_params), *others = parts(spec, params)
    own = template.kernels(spec, own_params)
    replaced = {k.replaces for k in own if k.replaces}
    first = [(p, k) for t, p in others for k in t.kernels(spec, p) if k.name not in replaced]
    return (*first, *((own_params, k) for k in own))


def template_knobs() -> dict[str, tuple[Knob, Template]]:
    """Every template's own knobs by name, each with the template that reads it."""
    knobs = {}
    for t in TEMPLATES:
        for k in t.knobs:
            if k.name in knobs:
                raise ValueError(f"knob {k.name} is declared by two templates")
            knobs[k.name] = (k, t)
    return knobs


__all__ = [
    "TEMPLATES",
    "Arg",
    "Kernel",
    "Knob",
    "Template",
    "direction_templates",
    "parts",
    "plan",
    "template_knobs",
    "template_of",
]
