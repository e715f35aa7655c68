"""One package's backward on a few canonical-grid cells, for an A/B of two versions of the
package run in turn on the same GPU (perf-notes v41).

Per cell: the shipped backward (the tuned configs; a version whose backward template changed
reads them only if its configs file is given the new template hash), the Gluon dK/dV and dQ
kernels on 64 x 64 tiles (gluon=2), and SDPA cuDNN's backward in the same process. Each is
checked by flash-attention's rule against an fp32 reference (outputs poisoned with NaN first)
on a sub-batch, then timed with do_bench (L2 flushed, median); each form's kernels come from
the PyTorch profiler.

usage: python benchmarks/experiments/bwd_ab.py --out OUT.json [--dtype fp16]
"""

from __future__ import annotations

import bwd_cells

from fa2gen.generator.spec import TuningParams

CELLS = [(128, 4096, False), (128, 16384, False), (128, 4096, True), (128, 16384, True), (64, 4096, True)]
VARIANTS = {
    "64x64 g2": TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=2, loads="tma_host", gluon=2),
}


if __name__ == "__main__":
    bwd_cells.main(CELLS, bwd_cells.shipped_and(VARIANTS), bwd_cells.show_variants)
