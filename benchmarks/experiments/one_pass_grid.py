"""The one pass (dq_mode atomic, gluon=1, 128 keys x 64 queries; perf-notes v48) beside the
shipped backward and SDPA cuDNN's over the canonical grid (D in {64, 128}, N from 512 to 16k,
without and with the causal mask), each checked and timed (bwd_cells.variants_row). The
shipped configs are read only with the configs file's backward template hash set to the
current template's.

usage: python benchmarks/experiments/one_pass_grid.py --out OUT.json [--dtype fp16]
"""

from __future__ import annotations

import bwd_cells

from fa2gen.generator.spec import TuningParams

CELLS = [(d, n, causal) for d in (64, 128) for causal in (False, True) for n in (512, 1024, 2048, 4096, 8192, 16384)]
VARIANTS = {"128x64 one pass": TuningParams(block_m=128, block_n=64, num_warps=8, num_stages=2, loads="tma_host",
                                            dq_mode="atomic", gluon=1)}


if __name__ == "__main__":
    bwd_cells.main(CELLS, bwd_cells.shipped_and(VARIANTS), bwd_cells.show_variants)
