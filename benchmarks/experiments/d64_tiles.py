"""The Gluon backward at D=64 on 128 x 64 tiles (perf-notes v40): does a wider step win where
the 128 x 32 and 64 x 64 candidates lose to the Triton kernels?

For D=64 cells of the canonical grid (N = 1k, 4k and 16k, causal off and on): the shipped
backward (the tuned configs), the Gluon candidates the tuner measures at D=64 (128 x 32 and
64 x 64, gluon=1 and 2), and 128 x 64 dK/dV tiles with 8 warps (gluon=1 and 2, two and three
stages, and dq_mode matmul). Each is checked by flash-attention's rule against an fp32 reference
(outputs poisoned with NaN first) on a sub-batch, then timed with do_bench (L2 flushed, median)
next to SDPA cuDNN's backward in the same process; each form's kernels come from the PyTorch
profiler (attn_bwd_dkdv, attn_bwd_dq; nvjet: cuBLAS's dQ matmul).

usage: python benchmarks/experiments/d64_tiles.py --out OUT.json [--dtype fp16]
"""

from __future__ import annotations

import bwd_cells

from fa2gen.generator.spec import TuningParams

CELLS = [(64, n, causal) for causal in (False, True) for n in (1024, 4096, 16384)]


def _gluon(m: int, n: int, stages: int, gluon: int, dq_mode: str = "separate") -> TuningParams:
    return TuningParams(block_m=m, block_n=n, num_warps=m // 16, num_stages=stages, loads="tma_host",
                        dq_mode=dq_mode, gluon=gluon)


VARIANTS = {
    "128x32 s2 g1": _gluon(128, 32, 2, 1),
    "128x32 s3 g2": _gluon(128, 32, 3, 2),
    "64x64 s2 g2": _gluon(64, 64, 2, 2),
    "128x64 s2 g1": _gluon(128, 64, 2, 1),
    "128x64 s2 g2": _gluon(128, 64, 2, 2),
    "128x64 s3 g2": _gluon(128, 64, 3, 2),
    "128x64 s2 matmul": _gluon(128, 64, 2, 1, "matmul"),
}


if __name__ == "__main__":
    bwd_cells.main(CELLS, bwd_cells.shipped_and(VARIANTS), bwd_cells.show_variants)
