"""The one pass (dq_mode atomic, gluon=1; perf-notes v47, v48) on 128 keys a program and 64
queries a step beside the shipped backward and SDPA cuDNN's, each checked and timed
(bwd_cells.variants_row), on four cells. Its form changed under this script: v47's compute
partitions computed dQ themselves and handed it to a warp group that added it
(results/one-pass/, v47b/, where 128 x 32 steps were measured too; the spec refuses those since
v48); since v48 the third warp group computes dQ from both partitions' dS^T and adds it. The
shipped configs are read only with the configs file's backward template hash set to the
current template's.

usage: python benchmarks/experiments/dq_add.py --out OUT.json [--dtype fp16]
"""

from __future__ import annotations

import bwd_cells

from fa2gen.generator.spec import TuningParams

CELLS = [(128, 4096, False), (128, 16384, False), (128, 4096, True), (64, 4096, False)]
VARIANTS = {
    "128x64 one pass": TuningParams(block_m=128, block_n=64, num_warps=8, num_stages=2, loads="tma_host",
                                    dq_mode="atomic", gluon=1),
}


if __name__ == "__main__":
    bwd_cells.main(CELLS, bwd_cells.shipped_and(VARIANTS), bwd_cells.show_variants)
