"""The one pass (dQ added by the TMA's bulk reduction) beside the shipped backward and cuDNN,
on the cells CELLS names ("D:N:causal,..."), run once per package."""
import os
import sys
sys.path.insert(0, "benchmarks/experiments")
import bwd_cells
import fa2gen
from fa2gen.generator.spec import TuningParams
CELLS = [(int(d), int(n), c == "1") for d, n, c in (x.split(":") for x in os.environ["CELLS"].split(","))]
VARIANTS = {"one pass": TuningParams(block_m=128, block_n=64, num_warps=8, num_stages=2, loads="tma_host",
                                     dq_mode="atomic", gluon=1)}
if __name__ == "__main__":
    print("package", fa2gen.__file__, flush=True)
    bwd_cells.main(CELLS, bwd_cells.shipped_and(VARIANTS), bwd_cells.show_variants)
