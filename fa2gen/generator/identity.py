"""Mechanical identity of a kernel variant: canonical JSON, digest and name.

The digest covers the spec and params fields, the template source and the Triton
version, so any change to one of them yields a new name and a new cache file.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass

from .rendering import template_hash
from .spec import KernelSpec, TuningParams

# Short tags for the readable part of a name; the digest keeps names unique.
_TAGS = {
    "block_m": "m",
    "block_n": "n",
    "num_warps": "w",
    "num_stages": "s",
}


@dataclass(frozen=True)
class Variant:
    spec: KernelSpec
    params: TuningParams

    def canonical_json(self) -> str:
        return canonical_json(self.spec, self.params)

    @functools.cached_property
    def digest(self) -> str:
        import triton  # imported late: TRITON_INTERPRET must be set before triton is imported

        payload = json.dumps(
            {
                "variant": json.loads(self.canonical_json()),
                "template": template_hash(self.spec.direction),
                "triton": triton.__version__,
            },
            sort_keys=True,
            separators=(",", ":"),
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:12]

    @functools.cached_property
    def name(self) -> str:
        s, p = self.spec, self.params
        parts = [f"fa2gen_{s.direction}", s.dtype, f"d{s.head_dim}", s.mask]
        if s.softcap:
            parts.append("softcap")
        parts += [f"{tag}{getattr(p, field)}" for field, tag in _TAGS.items()]
        parts.append(p.loads)
        if s.direction == "bwd":
            parts.append(f"dq{p.dq_mode}")
        if p.persistent:
            parts.append(f"persistent{p.persistent}")
        if p.gluon:
            parts.append(f"gluon{p.gluon}")
        parts.append(self.digest)
        return "_".join(parts)


def canonical_json(spec: KernelSpec, params: TuningParams) -> str:
    return json.dumps(
        {"spec": spec.to_dict(), "params": params.to_dict()},
        sort_keys=True,
        separators=(",", ":"),
    )
