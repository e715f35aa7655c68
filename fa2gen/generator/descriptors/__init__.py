"""One descriptor per template: each owns its template's contract in Python (the variants it
renders, the rules for which specs and params it renders, its Jinja variables and its shared
memory). spec.unsupported, rendering and arch.smem_estimate ask the descriptor of a variant's
template (``template_of``) rather than knowing the templates themselves."""

from __future__ import annotations

from ..spec import KernelSpec, TuningParams
from .attn_bwd import AttnBwd
from .attn_bwd_gluon import AttnBwdGluon
from .attn_fwd import AttnFwd
from .attn_fwd_gluon import AttnFwdGluon
from .base import Template

TEMPLATES: tuple[Template, ...] = (AttnFwd(), AttnBwd(), AttnFwdGluon(), AttnBwdGluon())
_BY_VARIANT = {(t.direction, g): t for t in TEMPLATES for g in t.gluon}


def template_of(spec: KernelSpec, params: TuningParams) -> Template:
    """The template that renders ``params`` for ``spec``."""
    return _BY_VARIANT[(spec.direction, params.gluon)]


def direction_templates(direction: str) -> tuple[Template, ...]:
    """A direction's templates, its Triton one first."""
    return tuple(t for t in TEMPLATES if t.direction == direction)


__all__ = ["TEMPLATES", "Template", "direction_templates", "template_of"]
