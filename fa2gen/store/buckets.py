"""Problem buckets: the classes of calls that share one best kernel config.

A bucket keeps exactly what changes the best tiling and rounds the rest:

- direction, dtype, head_dim, mask kind and softcap: the kernel spec, exact;
- GQA group size (Hq / Hkv), rounded up to a power of two (1, 2, 4, 8, 16+): larger
  groups reuse each K/V tile more;
- query and key lengths, each rounded up to a power of two from 1 to 65536: they set
  the loop length and, for short queries, the useful block_m;
- batch x query heads, rounded up to a power of two from 1 to 4096: with the number of
  query blocks it sets how many programs fill the GPU (occupancy);
- decode only, the KV cache's page size, rounded up to a power of two from 16 to 4096, or 0
  for a contiguous cache: it sets how far apart the rows of a key block lie. The query length
  is the new tokens, the key length the keys a cache holds;
- packed batches (``attention_varlen``), forward and backward: a bucket of their own (key
  suffix ``/varlen``), its lengths the longest sequence's and its batch the sequences'
  count.

Rounding up means a bucket named q4096 holds lengths 2049..4096. The canonical grid of
the FlashAttention-2 paper lands on bucket boundaries exactly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ..generator.spec import DIRECTIONS, DTYPES, HEAD_DIMS, MASKS, KernelSpec, SpecError

# fp16 and bf16 run one generated code but for the element type, with one schedule: a config
# tuned for one is a config for the other (fp8's kernels differ)
SIBLING_DTYPES = {"fp16": "bf16", "bf16": "fp16"}
# How far a sibling dtype's bucket counts beyond its shape's distance (``Bucket.gap``): less than
# one doubling, so the sibling's own bucket comes before a neighbour of this dtype
SIBLING_GAP = 0.5

MAX_SEQ = 65536
MAX_BH = 4096
MAX_GROUP = 16
MAX_PAGE = 4096
PAGES = (0,) + tuple(1 << i for i in range(4, MAX_PAGE.bit_length()))


def ceil_pow2(n: int, cap: int) -> int:
    return min(cap, 1 << max(0, (n - 1).bit_length()))


def _pow2_upto(cap: int) -> tuple[int, ...]:
    return tuple(1 << i for i in range(cap.bit_length()))


_PATTERN = re.compile(
    r"^(?P<direction>[a-z]+)/(?P<dtype>[a-z0-9]+)/d(?P<head_dim>\d+)/(?P<mask>[a-z]+)/sc(?P<softcap>[01])"
    r"/g(?P<group>\d+)/q(?P<seqlen_q>\d+)/k(?P<seqlen_k>\d+)/bh(?P<batch_heads>\d+)(/p(?P<page>\d+))?"
    r"(?P<varlen>/varlen)?$"
)


@dataclass(frozen=True, order=True)
class Bucket:
    direction: str
    dtype: str
    head_dim: int
    mask: str
    softcap: bool
    group: int
    seqlen_q: int
    seqlen_k: int
    batch_heads: int
    page: int = 0  # decode only: the cache's page size (0: contiguous)
    varlen: bool = False  # a packed batch's (fwd and bwd)

    def __post_init__(self) -> None:
        checks = (
            ("direction", self.direction, DIRECTIONS),
            ("dtype", self.dtype, DTYPES),
            ("head_dim", self.head_dim, HEAD_DIMS),
            ("mask", self.mask, MASKS),
            ("softcap", self.softcap, (False, True)),
            ("group", self.group, _pow2_upto(MAX_GROUP)),
            ("seqlen_q", self.seqlen_q, _pow2_upto(MAX_SEQ)),
            ("seqlen_k", self.seqlen_k, _pow2_upto(MAX_SEQ)),
            ("batch_heads", self.batch_heads, _pow2_upto(MAX_BH)),
            ("page", self.page, PAGES),
            ("varlen", self.varlen, (False, True)),
        )
        for name, value, allowed in checks:
            if type(value) is not type(allowed[0]) or value not in allowed:
                raise SpecError(f"Bucket.{name}: {value!r} is not one of the allowed values")
        if self.page and self.direction != "decode":
            raise SpecError(f"Bucket.page: pages are a KV cache's (decode), not {self.direction}'s")
        self.kernel_spec()  # the combination must be one a kernel computes (fp8: forward only)

    @classmethod
    def of(cls, problem, direction: str = "fwd") -> "Bucket":
        """The bucket of a ``fa2gen.runtime.problem.Problem`` (or anything with its fields)."""
        return cls(*bucket_fields(problem, direction))

    def kernel_spec(self) -> KernelSpec:
        """The kernel every problem of this bucket runs."""
        return KernelSpec(
            direction=self.direction,
            dtype=self.dtype,
            head_dim=self.head_dim,
            mask=self.mask,
            softcap=self.softcap,
            paged=self.page > 0,
            varlen=self.varlen,
        )

    @property
    def key(self) -> str:
        return (
            f"{self.direction}/{self.dtype}/d{self.head_dim}/{self.mask}/sc{int(self.softcap)}"
            f"/g{self.group}/q{self.seqlen_q}/k{self.seqlen_k}/bh{self.batch_heads}"
            + (f"/p{self.page}" if self.page else "")
            + ("/varlen" if self.varlen else "")
        )

    @classmethod
    def parse(cls, key: str) -> "Bucket":
        """Inverse of ``key``; rejects anything that is not a well-formed bucket key."""
        if not isinstance(key, str):
            raise SpecError(f"bucket key must be a string, got {type(key).__name__}")
        m = _PATTERN.fullmatch(key)
        if not m:
            raise SpecError(f"malformed bucket key {key!r}")
        g = m.groupdict()
        return cls(
            direction=g["direction"],
            dtype=g["dtype"],
            head_dim=int(g["head_dim"]),
            mask=g["mask"],
            softcap=g["softcap"] == "1",
            group=int(g["group"]),
            seqlen_q=int(g["seqlen_q"]),
            seqlen_k=int(g["seqlen_k"]),
            batch_heads=int(g["batch_heads"]),
            page=int(g["page"] or 0),
            varlen=g["varlen"] is not None,
        )

    def same_kernel(self, other: "Bucket") -> bool:
        """Whether ``other`` tunes the same kernel spec (its params are valid here)."""
        return self.kernel_spec() == other.kernel_spec()

    def gap(self, other: "Bucket") -> float | None:
        """How far ``other``'s tuned params are from this bucket's: its ``distance`` where it
        tunes the same kernel, plus ``SIBLING_GAP`` where it differs only in the sibling dtype
        (``SIBLING_DTYPES``), None where its params say nothing here."""
        if self.same_kernel(other):
            return self.distance(other)
        if SIBLING_DTYPES.get(self.dtype) == other.dtype and self.same_kernel(replace(other, dtype=self.dtype)):
            return self.distance(other) + SIBLING_GAP
        return None

    def distance(self, other: "Bucket") -> float:
        """How far apart two buckets of the same kernel are, in powers of two."""
        import math

        return sum(
            abs(math.log2(a) - math.log2(b))
            for a, b in (
                (self.group, other.group),
                (self.seqlen_q, other.seqlen_q),
                (self.seqlen_k, other.seqlen_k),
                (self.batch_heads, other.batch_heads),
                (max(16, self.page), max(16, other.page)),
            )
        )


def bucket_fields(problem, direction: str = "fwd") -> tuple:
    """A bucket's field values without building (and validating) the Bucket: a cheap
    hashable key for the per-call dispatch memo."""
    return (
        direction,
        problem.dtype,
        problem.head_dim,
        problem.mask,
        problem.softcap > 0,
        ceil_pow2(problem.heads_q // problem.heads_kv, MAX_GROUP),
        ceil_pow2(problem.seqlen_q, MAX_SEQ),
        ceil_pow2(problem.seqlen_k, MAX_SEQ),
        ceil_pow2(problem.batch * problem.heads_q, MAX_BH),
        max(16, ceil_pow2(problem.page_size, MAX_PAGE)) if direction == "decode" and problem.page_size else 0,
        problem.varlen,
    )
