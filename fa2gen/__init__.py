"""fa2gen: generated, tuned Triton FlashAttention-2 kernels."""

__version__ = "0.1.0"

__all__ = ["attention", "attention_varlen", "attention_with_kvcache", "__version__"]


def __getattr__(name: str):
    # ``attention`` is imported on first use (PEP 562), so that importing a torch-free part
    # such as ``fa2gen.store.shipped`` does not import torch and Triton.
    if name in ("attention", "attention_varlen", "attention_with_kvcache"):
        from .runtime import api

        globals()[name] = getattr(api, name)
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *__all__})
