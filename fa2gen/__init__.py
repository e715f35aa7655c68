"""fa2gen: generated, tuned Triton FlashAttention-2 kernels."""

from .runtime.api import attention

__version__ = "0.1.0"

__all__ = ["attention", "__version__"]
