"""dQ added from the Gluon dK/dV kernel with vector atomics (perf-notes v43): the shipped
backward against dq_mode atomic with gluon=1 on 64 x 32 (4 warps) and 128 x 32 (8 warps, the
two warp groups' dS^T summed over 128 keys in one matmul before the adds) tiles, and SDPA
cuDNN's backward, each checked and timed (bwd_cells.variants_row). The kernel is not on main:
apply benchmarks/results/dq-add/dq-add-v43.patch first (it adds dq_mode atomic to the Gluon
dK/dV kernel; the shipped configs are read only with the configs file's backward template
hash set to the patched template's).

usage: python benchmarks/experiments/dq_add.py --out OUT.json [--dtype fp16]
"""

from __future__ import annotations

import bwd_cells

from fa2gen.generator.spec import TuningParams

CELLS = [(128, 1024, False), (128, 4096, False), (128, 16384, False), (128, 4096, True), (128, 16384, True),
         (64, 4096, False), (64, 4096, True)]
VARIANTS = {
    "64x32 atomic": TuningParams(block_m=64, block_n=32, num_warps=4, num_stages=2, loads="tma_host",
                                 dq_mode="atomic", gluon=1),
    "64x32 atomic s3": TuningParams(block_m=64, block_n=32, num_warps=4, num_stages=3, loads="tma_host",
                                    dq_mode="atomic", gluon=1),
    "128x32 atomic": TuningParams(block_m=128, block_n=32, num_warps=8, num_stages=2, loads="tma_host",
                                  dq_mode="atomic", gluon=1),
}


if __name__ == "__main__":
    bwd_cells.main(CELLS, bwd_cells.shipped_and(VARIANTS), bwd_cells.show_variants)
