"""Dropout on the attention probabilities (``dropout_p``): the call's checked probability and
its seed, and the mask the kernels draw.

The kernels draw each (query row, key) pair's number from Philox-4x32-10 under one 64-bit
seed per call (``philox_dropout.py.jinja``), counter (group of 8 keys, query row, stream, 0),
a stream being a (batch, query head) or a packed batch's query head: each draw's four words
give the group's eight keys a 16-bit number each, kept where it reaches dropout_p's threshold
(``keep_rate``). The backward draws the same
numbers again, so nothing N x N is stored. The seed is drawn on the inputs' device from
torch's generator: ``torch.manual_seed`` makes a call repeatable, and it stays a tensor, so
the kernels' arguments do not change from call to call.
"""

from __future__ import annotations

import contextlib
import math
import numbers

import torch

from ..generator.cache import interpreting, load_module
from ..generator.spec import KernelSpec, TuningParams
from .problem import Problem

# Seeds from 2**32 on: Philox takes the seed's two 32-bit halves as its key, so both vary
_SEED_LOW, _SEED_HIGH = 2**32, 2**62
# Rows and key columns one program of the mask kernel fills per step
_MASK_BLOCK = 32


def check_dropout(dropout_p) -> float:
    """``dropout_p`` as a float in [0, 1); raises naming it."""
    if type(dropout_p) is not float and (isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real)):
        raise TypeError(f"dropout_p must be a real number, got {type(dropout_p).__name__}")
    p = float(dropout_p)
    if not 0.0 <= p < 1.0:  # (NaN fails too)
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    return p


def keep_rate(dropout_p: float) -> float:
    """The chance the kernels keep a probability: 1 - dropout_p at their resolution of 1/65536
    (a 16-bit threshold, round half up); kept values are scaled by its inverse."""
    return 1.0 - math.floor(dropout_p * 65536.0 + 0.5) / 65536.0


def draw_seed(device) -> torch.Tensor:
    """One call's seed, an int64 tensor of one value on ``device``, from torch's generator of
    that device (so under ``torch.manual_seed(s)`` the same calls draw the same seeds)."""
    return torch.randint(_SEED_LOW, _SEED_HIGH, (1,), dtype=torch.int64, device=device)


def keep_mask(seed: torch.Tensor, dropout_p: float, streams: int, rows: int, cols: int) -> torch.Tensor:
    """The mask the kernels draw under ``seed`` (as ``draw_seed`` gives it): (streams, rows,
    cols) bool, True where a probability is kept (each with chance 1 - dropout_p). Runs a
    kernel of the generated forward (CUDA, or Triton's interpreter on CPU)."""
    p = check_dropout(dropout_p)
    if not isinstance(seed, torch.Tensor) or seed.dtype != torch.int64 or seed.numel() != 1:
        raise ValueError("seed must be an int64 tensor of one value, as draw_seed gives it")
    if seed.device.type != "cuda" and not interpreting():
        raise RuntimeError("keep_mask runs a Triton kernel: a CUDA seed, or TRITON_INTERPRET=1 on CPU")
    keep = torch.empty((streams, rows, cols), dtype=torch.int8, device=seed.device)
    if keep.numel():
        module = load_module(KernelSpec(direction="fwd", dropout=True), TuningParams())
        grid = (-(-rows // _MASK_BLOCK), streams)
        with torch.cuda.device(seed.device) if seed.is_cuda else contextlib.nullcontext():
            module.attn_dropout_mask[grid](seed, keep, rows, cols, p, BLOCK=_MASK_BLOCK)
    return keep.bool()


def problem_mask(seed: torch.Tensor, dropout_p: float, problem: Problem) -> torch.Tensor:
    """``keep_mask`` for ``problem``'s call: (B, Hq, Nq, Nk) for ``attention()``; for a packed
    batch (Hq, total_q, max_seqlen_k), sequence b's keys of row r at [h, r, :N_b]."""
    if problem.varlen:
        return keep_mask(seed, dropout_p, problem.heads_q, problem.total_q, problem.seqlen_k)
    mask = keep_mask(seed, dropout_p, problem.batch * problem.heads_q, problem.seqlen_q, problem.seqlen_k)
    return mask.view(problem.batch, problem.heads_q, problem.seqlen_q, problem.seqlen_k)
