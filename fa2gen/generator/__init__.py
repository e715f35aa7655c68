"""Spec -> render -> cached module. Nothing here touches a GPU."""

from .arch import ARCHES, arch_from_capability, fits, smem_estimate
from .cache import load_module, write_module
from .identity import Variant, canonical_json
from .rendering import render, template_hash
from .spec import KernelSpec, SpecError, TuningParams, param_space

__all__ = [
    "ARCHES",
    "KernelSpec",
    "SpecError",
    "TuningParams",
    "Variant",
    "arch_from_capability",
    "canonical_json",
    "fits",
    "load_module",
    "param_space",
    "render",
    "smem_estimate",
    "template_hash",
    "write_module",
]
