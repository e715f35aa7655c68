"""Render a (KernelSpec, TuningParams) pair to Triton source through Jinja."""

from __future__ import annotations

import functools
import hashlib
from importlib import resources

import jinja2

from .. import compat
from .spec import KernelSpec, SpecError, TuningParams, gluon_overlap, gluon_wide, unsupported

# Each direction's Triton template, and the forward's Gluon one (TuningParams.gluon > 0).
TEMPLATES = {"fwd": "attn_fwd.py.jinja", "bwd": "attn_bwd.py.jinja"}
GLUON_TEMPLATES = {"fwd": "attn_fwd_gluon.py.jinja", "bwd": "attn_bwd_gluon.py.jinja"}
GLUON_TEMPLATE = GLUON_TEMPLATES["fwd"]
# The other templates a direction renders from. A tuned entry chose among all of its
# direction's templates, so the direction's hash covers them all.
EXTRA_TEMPLATES = {"fwd": (GLUON_TEMPLATES["fwd"],), "bwd": (GLUON_TEMPLATES["bwd"],)}


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("fa2gen", "templates"),
        undefined=jinja2.StrictUndefined,  # a missing variable is a bug, never an empty string
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


@functools.lru_cache(maxsize=None)
def _file_source(filename: str) -> str:
    return resources.files("fa2gen").joinpath("templates", filename).read_text()


def template_source(direction: str) -> str:
    """Source of a direction's Triton template."""
    return _file_source(TEMPLATES[direction])


def template_file(spec: KernelSpec, params: TuningParams) -> str:
    return GLUON_TEMPLATES[spec.direction] if params.gluon else TEMPLATES[spec.direction]


@functools.lru_cache(maxsize=None)
def template_hash(direction: str) -> str:
    """Digest of the sources a direction renders from (the cache key's template component):
    its Triton template, then any others in ``EXTRA_TEMPLATES`` order."""
    sources = [template_source(direction)] + [_file_source(f) for f in EXTRA_TEMPLATES[direction]]
    return hashlib.sha256("".join(sources).encode()).hexdigest()[:16]


def render(spec: KernelSpec, params: TuningParams, *, name: str, triton: str | None = None) -> str:
    """Triton module source for one variant, as Triton ``triton`` (a version string; default:
    the installed one) is to compile it. Inputs are validated dataclasses."""
    if not isinstance(spec, KernelSpec) or not isinstance(params, TuningParams):
        raise TypeError("render() takes a KernelSpec and a TuningParams")
    why = unsupported(spec, params)
    if why:
        raise SpecError(why)
    template = _environment().get_template(template_file(spec, params))
    gluon_fwd = spec.direction == "fwd" and params.gluon > 0
    ver = compat.parse_version(triton) if triton is not None else None
    return template.render(
        name=name,
        spec_repr=repr(spec.to_dict()),  # validated scalars only: a safe Python literal
        spec=spec,
        params=params,
        head_dim=spec.head_dim,
        head_dim_padded=spec.head_dim_padded,
        pad_head=spec.head_dim != spec.head_dim_padded,
        fp8=spec.fp8,
        persistent=params.persistent,
        mask=spec.mask,
        softcap=spec.softcap,
        loads=params.loads,
        dq_atomic=params.dq_mode in ("atomic", "tma_reduce"),
        dq_mode=params.dq_mode,
        # the Gluon forward's derived forms, decided once in spec.py for the template, the
        # shared-memory estimate and the tests alike
        overlap=gluon_overlap(spec, params),
        wide=gluon_wide(spec, params),
        # the Gluon forward adds its rows' exponentials itself where Triton would add them as a tree
        chain_sum=gluon_fwd and compat.sums_in_tree(ver),
    )
