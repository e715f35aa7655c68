"""Mechanical identity of a kernel variant: canonical JSON, digest and name, and the digest
of the code it renders to.

The digest covers the spec and params fields, the template source and the Triton
version, so any change to one of them yields a new name and a new cache file. The code
digest covers only what the variant's generated modules compute (comments, docstrings and
blank lines left out): a tuned entry is valid while it is unchanged.
"""

from __future__ import annotations

import functools
import hashlib
import io
import itertools
import json
import tokenize
from dataclasses import dataclass

from .descriptors import parts
from .rendering import render, template_hash
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
        if s.varlen:
            parts.append("varlen")
        if s.paged:
            parts.append("paged")
        if s.alibi:
            parts.append("alibi")
        if s.dropout:
            parts.append("dropout")
        parts += [f"{tag}{getattr(p, field)}" for field, tag in _TAGS.items()]
        parts.append(p.loads)
        if s.direction == "bwd":
            parts.append(f"dq{p.dq_mode}")
        if p.persistent:
            parts.append(f"persistent{p.persistent}")
        if p.gluon:
            parts.append(f"gluon{p.gluon}")
        parts += [f"{k}{v}" for k, v in p.extra]  # a template's own knobs off their default
        parts.append(self.digest)
        return "_".join(parts)


def canonical_json(spec: KernelSpec, params: TuningParams) -> str:
    return json.dumps(
        {"spec": spec.to_dict(), "params": params.to_dict()},
        sort_keys=True,
        separators=(",", ":"),
    )


def normalised(source: str) -> str:
    """Python ``source`` without what cannot change what it computes: comments, docstrings
    (any statement that is only a string), blank lines and trailing spaces. Tokens are only
    located, never re-joined, so the text kept is the source's own on every Python."""
    drop = []  # (start, end) positions of comments and of string-only statements
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    layout = {tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT}
    before = None  # the last token that is not layout
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.COMMENT:
            drop.append((tok.start, tok.end))
        elif tok.type == tokenize.STRING and (
            before is None or before.type == tokenize.NEWLINE or before.string == ":"
        ):
            after = next((t for t in itertools.islice(tokens, i + 1, None) if t.type not in layout), None)
            if after is not None and after.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
                drop.append((tok.start, tok.end))
        if tok.type not in layout:
            before = tok
    lines = source.splitlines()
    for (row0, col0), (row1, col1) in reversed(drop):
        if row0 == row1:
            lines[row0 - 1] = lines[row0 - 1][:col0] + lines[row0 - 1][col1:]
        else:
            lines[row0 - 1 : row1] = [lines[row0 - 1][:col0] + lines[row1 - 1][col1:]]
    return "\n".join(line.rstrip() for line in lines if line.strip())


@functools.lru_cache(maxsize=4096)
def code_digest(spec: KernelSpec, params: TuningParams, triton: str | None = None) -> str:
    """Digest of the code ``params`` render to for ``spec`` under Triton ``triton`` (default: the
    installed): every module the variant runs, normalised. The name the modules carry is left
    out (it holds the Triton version). An entry is judged by the code of the version it was
    tuned under, so a version-specific form does not stale other versions' entries."""
    h = hashlib.sha256()
    for _, p in parts(spec, params):
        h.update(normalised(render(spec, p, name="variant", triton=triton)).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]
