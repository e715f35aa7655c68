"""dQ over the stored dS in a Gluon kernel of its own (perf-notes v45) against the batched
matmuls by bands of queries it replaces: run once per package version (the one before v45 and
the one with it) on the same GPU. Per cell: the shipped backward (the tuned configs; a version
whose backward template changed reads them only with its configs file's backward template hash
set to the new one), dq_mode matmul on the two candidate tiles, and SDPA cuDNN's backward, each
checked and timed (bwd_cells.variants_row).

usage: python benchmarks/experiments/dq_ds.py --out OUT.json [--dtype fp16]
"""

from __future__ import annotations

import bwd_cells

from fa2gen.generator.spec import TuningParams

CELLS = [(128, 1024, False), (128, 4096, False), (128, 16384, False), (128, 1024, True), (128, 4096, True),
         (128, 16384, True), (64, 4096, False), (64, 4096, True), (64, 16384, True)]
VARIANTS = {
    "64x64 matmul": TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=2, loads="tma_host",
                                 dq_mode="matmul", gluon=1),
    "64x32 matmul s3": TuningParams(block_m=64, block_n=32, num_warps=4, num_stages=3, loads="tma_host",
                                    dq_mode="matmul", gluon=1),
}


if __name__ == "__main__":
    bwd_cells.main(CELLS, bwd_cells.shipped_and(VARIANTS), bwd_cells.show_variants)
