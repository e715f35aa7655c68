"""Render a (KernelSpec, TuningParams) pair to Triton source through Jinja."""

from __future__ import annotations

import functools
import hashlib
from importlib import resources

import jinja2

from .. import compat
from .descriptors import direction_templates, template_of
from .spec import DIRECTIONS, KernelSpec, SpecError, TuningParams, unsupported

# Each direction's Triton template, and its Gluon one (TuningParams.gluon > 0): the files of
# the descriptors' templates.
TEMPLATES = {d: direction_templates(d)[0].file for d in DIRECTIONS}
GLUON_TEMPLATES = {d: direction_templates(d)[1].file for d in ("fwd", "bwd")}
GLUON_TEMPLATE = GLUON_TEMPLATES["fwd"]
# The other templates a direction renders from. A tuned entry chose among all of its
# direction's templates, so the direction's hash covers them all.
EXTRA_TEMPLATES = {d: tuple(t.file for t in direction_templates(d)[1:]) for d in DIRECTIONS}
# Files a direction's templates include (Jinja ``include``), hashed with them
INCLUDED = {"fwd": ("philox_dropout.py.jinja",), "bwd": ("philox_dropout.py.jinja",), "decode": ()}


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
    return template_of(spec, params).file


@functools.lru_cache(maxsize=None)
def template_hash(direction: str) -> str:
    """Digest of the sources a direction renders from (the cache key's template component):
    its Triton template, then any others in ``EXTRA_TEMPLATES`` order, then the files they
    include."""
    files = EXTRA_TEMPLATES[direction] + INCLUDED[direction]
    sources = [template_source(direction)] + [_file_source(f) for f in files]
    return hashlib.sha256("".join(sources).encode()).hexdigest()[:16]


def render(spec: KernelSpec, params: TuningParams, *, name: str, triton: str | None = None) -> str:
    """Triton module source for one variant, as Triton ``triton`` (a version string; default:
    the installed one) is to compile it. Inputs are validated dataclasses."""
    if not isinstance(spec, KernelSpec) or not isinstance(params, TuningParams):
        raise TypeError("render() takes a KernelSpec and a TuningParams")
    why = unsupported(spec, params)
    if why:
        raise SpecError(why)
    descriptor = template_of(spec, params)
    ver = compat.parse_version(triton) if triton is not None else None
    return _environment().get_template(descriptor.file).render(**descriptor.variables(spec, params, name, ver))
