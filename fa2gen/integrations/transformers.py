"""Hugging Face transformers (5.x): "fa2gen" as an attention implementation.

    import fa2gen.integrations.transformers as fa2gen_hf
    fa2gen_hf.register()
    model = AutoModelForCausalLM.from_config(config, attn_implementation="fa2gen")

``register()`` adds the attention function to ``AttentionInterface`` and, under the same name,
flash-attention's mask function to ``AttentionMaskInterface``: the model then hands the
function no mask for an unpadded batch (causal masking and sliding windows are the kernel's)
and the 2-D padding mask otherwise, so that padding is never dropped. A call then takes one
of four paths:

- a padding mask: the padded tokens are removed, the packed sequences attend through
  ``attention_varlen`` and the output is padded again (zeros at the padded positions);
- padding-free packed inputs (one row whose ``position_ids`` restart at 0, or flash-attention's
  ``cu_seq_lens_q``/``cu_seq_lens_k`` keywords): ``attention_varlen`` over the sequences;
- decoding (up to 16 new tokens, no gradient, CUDA): ``attention_with_kvcache`` over the
  cache's keys and values, viewed as a full cache (no copies);
- otherwise ``attention``, bottom-right causal (a query sees the keys up to its own position),
  with the layer's sliding window.

fp32 inputs (layer norms kept in fp32) are cast to the layer's fp16 or bf16 weights' dtype
and the output cast back, as transformers does for flash-attention.
"""

from __future__ import annotations

import torch

from ..runtime.api import attention, attention_varlen, attention_with_kvcache

NAME = "fa2gen"
# Decoding steps of up to this many new tokens read the cache through the KV-cache kernels
DECODE_TOKENS = 16


def register(name: str = NAME) -> None:
    """Make ``attn_implementation=name`` select fa2gen in transformers models."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, flash_attention_mask)


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: query (B, Hq, Nq, D), key and value (B, Hkv,
    Nk, D), the mask ``register``'s mask function made; returns ((B, Nq, Hq, D), None)."""
    if kwargs.get("output_attentions"):
        raise ValueError("output_attentions: fa2gen never forms the attention matrix; use attn_implementation='eager'")
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    dtype = query.dtype
    query, key, value = _half(module, query, key, value)
    b, _, nq, _ = query.shape
    nk = key.shape[2]
    window = (-1, -1)
    if sliding_window is not None and nk > sliding_window:  # (causal keeps right at 0)
        window = (sliding_window - 1, sliding_window - 1)
    options = dict(causal=bool(is_causal), sm_scale=scaling, window_size=window, softcap=float(softcap or 0.0))
    dropout_p = float(dropout)
    packed = None if attention_mask is not None else _packed_offsets(kwargs, b, nq, nk, query.device)
    if attention_mask is not None:
        out = _padded(query, key, value, attention_mask.bool(), dropout_p, options)
    elif packed is not None:
        out = _packed(query, key, value, *packed, dropout_p, options)
    elif _decoding(query, key, value, nq, dropout_p):
        options["causal"] = options["causal"] and nq > 1  # (one token's causal mask is none)
        lengths = torch.full((b,), nk, dtype=torch.int32, device=query.device)
        out = attention_with_kvcache(
            query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), lengths, **options
        )
    else:
        out = attention(query, key, value, dropout_p=dropout_p, **options).transpose(1, 2)
    return out.to(dtype), None


def _half(module, *tensors):
    """fp16 and bf16 tensors as they are; fp32 ones in the layer's half-precision dtype."""
    if tensors[0].dtype in (torch.float16, torch.bfloat16):
        return tensors
    target = next((p.dtype for p in module.parameters() if p.dtype in (torch.float16, torch.bfloat16)), None)
    if target is None:
        raise ValueError(f"fa2gen attention takes fp16 or bf16; the layer computes in {tensors[0].dtype}")
    return tuple(t.to(target) for t in tensors)


def _decoding(query, key, value, nq: int, dropout_p: float) -> bool:
    return (
        query.is_cuda
        and nq <= DECODE_TOKENS
        and dropout_p == 0.0
        and not torch.compiler.is_compiling()
        and not (torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad))
    )


def _offsets(lengths: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))


def _rows(t: torch.Tensor) -> torch.Tensor:
    """(B, H, N, D) as (B * N, H, D) rows."""
    return t.transpose(1, 2).reshape(-1, t.shape[1], t.shape[3])


def _padded(query, key, value, mask, dropout_p, options):
    """Attention of a padded batch: ``mask`` (B, Nk) marks the real keys, its last Nq columns
    the real queries (left or right padding alike); each sequence sees its own real keys,
    bottom-right aligned. Padded query positions return zeros."""
    b, hq, nq, d = query.shape
    keys, queries = mask, mask[:, -nq:]
    lengths_k, lengths_q = keys.sum(1, dtype=torch.int32), queries.sum(1, dtype=torch.int32)
    index_k, index_q = keys.flatten().nonzero().squeeze(1), queries.flatten().nonzero().squeeze(1)
    longest_q, longest_k = (int(x) for x in torch.stack([lengths_q.max(), lengths_k.max()]).tolist())
    out = attention_varlen(
        _rows(query).index_select(0, index_q),
        _rows(key).index_select(0, index_k),
        _rows(value).index_select(0, index_k),
        _offsets(lengths_q),
        _offsets(lengths_k),
        longest_q,
        longest_k,
        dropout_p=dropout_p,
        **options,
    )
    full = out.new_zeros(b * nq, hq, d).index_copy(0, index_q, out)
    return full.view(b, nq, hq, d)


def _packed_offsets(kwargs, b: int, nq: int, nk: int, device):
    """(cu_seqlens_q, cu_seqlens_k, max_q, max_k) of padding-free packed inputs, or None: the
    keywords flash-attention integrations pass, or one row whose position_ids restart at 0."""
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None and cu_k is not None:
        return cu_q.int(), cu_k.int(), int(kwargs["max_length_q"]), int(kwargs["max_length_k"])
    positions = kwargs.get("position_ids")
    if positions is None or b != 1 or nq != nk or nq == 1:
        return None
    positions = positions.reshape(-1)
    starts = (positions == 0).nonzero().squeeze(1)
    if positions.numel() != nq or len(starts) == 0 or len(starts) == 1 and int(starts[0]) == 0:
        return None  # one increasing run (or positions that are not the tokens'): the plain path
    starts = torch.cat([starts.new_zeros(1), starts[starts > 0], starts.new_full((1,), nq)]).to(torch.int32)
    longest = int((starts[1:] - starts[:-1]).max())
    return starts.to(device), starts.to(device), longest, longest


def _packed(query, key, value, cu_q, cu_k, max_q, max_k, dropout_p, options):
    """Attention of one row of packed sequences, (1, N, Hq, D)."""
    out = attention_varlen(
        _rows(query), _rows(key), _rows(value), cu_q, cu_k, max_q, max_k, dropout_p=dropout_p, **options
    )
    return out.unsqueeze(0)
