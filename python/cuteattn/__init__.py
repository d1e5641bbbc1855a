"""cuteattn: fused attention (FlashAttention-class softmax attention and HSTU pointwise attention) for PyTorch.

CPU tensors run the library's CPU backend, CUDA tensors the best compiled kernel (sm90 on Hopper, else sm80).
Every function is a torch custom operator with autograd, so torch.compile(fullgraph=True) traces through it and
CUDA graphs can capture it. What is computed is docs/SEMANTICS.md; `cuteattn.reference` evaluates the
same formulas in plain PyTorch.
"""

from ._binding import _C
from .interface import BACKENDS, flash_attn_func, flash_attn_varlen_func, hstu_attn_varlen_func

__version__ = _C.version()


def compiled_archs() -> str:
    """Comma-separated GPU architectures compiled into the library ("" for a CPU-only build)."""
    return _C.compiled_archs()


def cuda_available() -> bool:
    """The library was built with CUDA and a device is present."""
    return _C.cuda_available()


__all__ = [
    "BACKENDS",
    "compiled_archs",
    "cuda_available",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "hstu_attn_varlen_func",
]
