"""fa2gen: generated, tuned Triton FlashAttention-2 kernels."""

__version__ = "0.1.0"

__all__ = [
    "attention",
    "attention_varlen",
    "attention_with_kvcache",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "__version__",
]
_FLASH_ATTN = ("flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache")


def __getattr__(name: str):
    # ``attention`` is imported on first use (PEP 562), so that importing a torch-free part
    # such as ``fa2gen.store.shipped`` does not import torch and Triton.
    if name in ("attention", "attention_varlen", "attention_with_kvcache"):
        from .runtime import api

        globals()[name] = getattr(api, name)
        return globals()[name]
    if name in _FLASH_ATTN:  # flash-attention's signatures (integrations.flash_attn)
        from .integrations import flash_attn

        globals()[name] = getattr(flash_attn, name)
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *__all__})
