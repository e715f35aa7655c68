"""dQ added from the Gluon dK/dV kernel by a warp group of its own (perf-notes v44): the
shipped backward against dq_mode atomic with gluon=1 on 64 x 32 (4 compute warps), 128 x 32
and 128 x 64 (8 compute warps, dS^T summed over 128 keys in one matmul before the adds) tiles,
and SDPA cuDNN's backward, each checked and timed (bwd_cells.variants_row). The compute warps
hand each step's dQ^T to the adder warps through shared memory; the adders issue the 16-byte
atomics. The shipped configs are read only with the configs file's backward template hash set
to the current template's.

usage: python benchmarks/experiments/dq_add.py --out OUT.json [--dtype fp16]
"""

from __future__ import annotations

import bwd_cells

from fa2gen.generator.spec import TuningParams

CELLS = [(128, 4096, False), (128, 16384, False), (128, 4096, True), (64, 4096, False)]
VARIANTS = {
    "128x64 one pass": TuningParams(block_m=128, block_n=64, num_warps=8, num_stages=2, loads="tma_host",
                                    dq_mode="atomic", gluon=1),
    "128x32 one pass s3": TuningParams(block_m=128, block_n=32, num_warps=8, num_stages=3, loads="tma_host",
                                       dq_mode="atomic", gluon=1),
    "128x32 one pass s4": TuningParams(block_m=128, block_n=32, num_warps=8, num_stages=4, loads="tma_host",
                                       dq_mode="atomic", gluon=1),
}


if __name__ == "__main__":
    bwd_cells.main(CELLS, bwd_cells.shipped_and(VARIANTS), bwd_cells.show_variants)
