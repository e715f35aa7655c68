"""fa2gen: generated, tuned Triton FlashAttention-2 kernels."""

__version__ = "0.1.0"

__all__ = ["attention", "__version__"]


def __getattr__(name: str):
    # ``attention`` is imported on first use (PEP 562), so that importing a torch-free part
    # such as ``fa2gen.store.shipped`` does not import torch and Triton.
    if name == "attention":
        from .runtime.api import attention

        globals()["attention"] = attention
        return attention
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *__all__})
