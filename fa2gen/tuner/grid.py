"""Which buckets ``fa2gen tune`` tunes: a built-in default or a ``--grid`` YAML file.

Grid file (every key optional except ``problems``; unknown keys are errors)::

    problems:
      - directions: [fwd]              # fwd | bwd | decode (a KV cache: seqlens_q new tokens,
                                       #   seqlens_k the keys a cache holds)
        dtypes: [fp16, bf16]
        head_dims: [64, 128]
        masks: [none, causal]          # none | causal | local
        softcap: [false]
        groups: [1]                    # GQA group size Hq / Hkv
        seqlens: [512, 1024]           # query length = key length ...
        seqlens_q: [1, 16]             # ... or every (q, k) pair of these two lists
        seqlens_k: [8192]
        tokens: 16384                  # batch * seqlen_q; with hidden gives batch * heads
        hidden: 2048                   # = heads * head_dim
        batch_heads: [64]              # ... or give batch * heads directly
        pages: [0, 16]                 # decode only: the KV cache's page size (0: contiguous)
        varlen: [true]                 # fwd and bwd: packed batches (attention_varlen), their
                                       #   seqlens the longest sequence's, tokens // seqlen
                                       #   sequences, timed with lengths spread up to it

Lengths and batch*heads are rounded up to bucket boundaries (powers of two).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import yaml

from ..generator.spec import SpecError
from ..store.buckets import MAX_BH, MAX_GROUP, MAX_PAGE, MAX_SEQ, Bucket, ceil_pow2
from ..store.records import RecordError
from ..store.yamlfile import read_text, yaml_problem

_KEYS = {
    "directions",
    "dtypes",
    "head_dims",
    "masks",
    "softcap",
    "groups",
    "seqlens",
    "seqlens_q",
    "seqlens_k",
    "tokens",
    "hidden",
    "batch_heads",
    "pages",
    "varlen",
}

CANONICAL_SEQLENS = [512, 1024, 2048, 4096, 8192, 16384]
DEFAULT_GRID = {
    "problems": [
        # The FlashAttention-2 paper's grid, plus head_dim 256.
        {
            "dtypes": ["fp16", "bf16"],
            "head_dims": [64, 128, 256],
            "masks": ["none", "causal"],
            "seqlens": CANONICAL_SEQLENS,
            "tokens": 16384,
            "hidden": 2048,
        },
        # Short queries against a long cache (decoding, chunked prefill).
        {
            "dtypes": ["fp16", "bf16"],
            "head_dims": [64, 128],
            "masks": ["none", "causal"],
            "seqlens_q": [1, 16, 64, 256],
            "seqlens_k": [8192],
            "batch_heads": [64],
        },
        # Decoding over a KV cache (``--directions decode``): 1, 4 and 16 new tokens of 32 query
        # heads in GQA groups of 4, batch 1, 8 and 64, contiguous and in pages of 16 keys.
        *(
            {
                "directions": ["decode"],
                "dtypes": ["fp16", "bf16"],
                "head_dims": [128],
                "masks": [mask],
                "groups": [4],
                "seqlens_q": tokens,
                "seqlens_k": [512, 8192, 65536],
                "batch_heads": [32, 256, 2048],
                "pages": [0, 16],
            }
            for mask, tokens in (("none", [1]), ("causal", [4, 16]))  # (one token's causal mask is none)
        ),
        # Packed batches (attention_varlen), forward and backward, of 16k tokens in sequences up
        # to 2k and 8k long.
        {
            "directions": ["fwd", "bwd"],
            "dtypes": ["fp16", "bf16"],
            "head_dims": [64, 128],
            "masks": ["none", "causal"],
            "seqlens": [2048, 8192],
            "tokens": 16384,
            "hidden": 2048,
            "varlen": [True],
        },
        # The backward pass on the paper's grid (training: no decoding shapes).
        {
            "directions": ["bwd"],
            "dtypes": ["fp16", "bf16"],
            "head_dims": [64, 128, 256],
            "masks": ["none", "causal"],
            "seqlens": CANONICAL_SEQLENS,
            "tokens": 16384,
            "hidden": 2048,
        },
    ]
}


class GridError(ValueError):
    pass


def _list(block: dict, key: str, default, kind):
    value = block.get(key, default)
    if not isinstance(value, list) or not value or not all(type(v) is kind for v in value):
        raise GridError(f"{key}: expected a non-empty list of {kind.__name__}, got {value!r}")
    return value


def _int(block: dict, key: str, default: int) -> int:
    value = block.get(key, default)
    if type(value) is not int or value < 1:
        raise GridError(f"{key}: expected a positive integer, got {value!r}")
    return value


def _page(size: int) -> int:
    if size < 0:
        raise GridError(f"pages: a page size is 0 (contiguous) or positive, got {size}")
    return 0 if size == 0 else max(16, ceil_pow2(size, MAX_PAGE))


def buckets_from_grid(grid: dict) -> list[Bucket]:
    if not isinstance(grid, dict) or set(grid) != {"problems"} or not isinstance(grid["problems"], list):
        raise GridError("a grid is a mapping with one key, problems: a list of problem blocks")
    out: dict[str, Bucket] = {}
    for i, block in enumerate(grid["problems"]):
        if not isinstance(block, dict):
            raise GridError(f"problems[{i}]: expected a mapping")
        unknown = set(map(str, block)) - _KEYS
        if unknown:
            raise GridError(f"problems[{i}]: unknown keys {sorted(unknown)}")
        try:
            directions = _list(block, "directions", ["fwd"], str)
            dtypes = _list(block, "dtypes", ["fp16", "bf16"], str)
            head_dims = _list(block, "head_dims", [64, 128], int)
            masks = _list(block, "masks", ["none", "causal"], str)
            softcaps = _list(block, "softcap", [False], bool)
            groups = _list(block, "groups", [1], int)
            if "seqlens" in block and ("seqlens_q" in block or "seqlens_k" in block):
                raise GridError("give seqlens, or seqlens_q with seqlens_k, not both")
            if "seqlens" in block:
                pairs = [(n, n) for n in _list(block, "seqlens", None, int)]
            else:
                pairs = list(
                    itertools.product(
                        _list(block, "seqlens_q", CANONICAL_SEQLENS, int),
                        _list(block, "seqlens_k", CANONICAL_SEQLENS, int),
                    )
                )
            if "batch_heads" in block and ("tokens" in block or "hidden" in block):
                raise GridError("give batch_heads, or tokens with hidden, not both")
            pages = [0] if "pages" not in block else [_page(p) for p in _list(block, "pages", None, int)]
            packed = _list(block, "varlen", [False], bool)
            for di, dt, d, m, sc, g, (nq, nk), page, varlen in itertools.product(
                directions, dtypes, head_dims, masks, softcaps, groups, pairs, pages, packed
            ):
                if min(nq, nk, g) < 1:
                    raise GridError(f"non-positive size in {block!r}")
                if "batch_heads" in block:
                    bhs = _list(block, "batch_heads", None, int)
                else:
                    tokens, hidden = _int(block, "tokens", 16384), _int(block, "hidden", 2048)
                    bhs = [max(1, tokens // nq) * max(1, hidden // d)]
                for bh in bhs:
                    b = Bucket(
                        di,
                        dt,
                        d,
                        m,
                        sc,
                        ceil_pow2(g, MAX_GROUP),
                        ceil_pow2(nq, MAX_SEQ),
                        ceil_pow2(nk, MAX_SEQ),
                        ceil_pow2(max(bh, 1), MAX_BH),
                        page,
                        varlen,
                    )
                    out[b.key] = b
        except SpecError as e:
            raise GridError(f"problems[{i}]: {e}") from None
    return sorted(out.values(), key=lambda b: b.key)


def read_grid(path: str | Path) -> list[Bucket]:
    try:
        data = yaml.safe_load(read_text(path))
    except yaml.YAMLError as e:
        raise GridError(f"cannot read grid {path}: not valid YAML: {yaml_problem(e)}") from None
    except RecordError as e:
        raise GridError(f"cannot read grid {path}: {e}") from None
    return buckets_from_grid(data)


def default_buckets(directions=("fwd",)) -> list[Bucket]:
    return [b for b in buckets_from_grid(DEFAULT_GRID) if b.direction in directions]
