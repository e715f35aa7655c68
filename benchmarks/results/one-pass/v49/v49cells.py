"""The one pass on D=64 cells beside the shipped backward and cuDNN (run once per package)."""
import sys
sys.path.insert(0, "benchmarks/experiments")
import bwd_cells
import fa2gen
from fa2gen.generator.spec import TuningParams
CELLS = [(64, 1024, False), (64, 4096, False), (64, 16384, False), (64, 2048, True), (64, 4096, True), (64, 16384, True)]
VARIANTS = {"one pass": TuningParams(block_m=128, block_n=64, num_warps=8, num_stages=2, loads="tma_host",
                                     dq_mode="atomic", gluon=1)}
if __name__ == "__main__":
    print("package", fa2gen.__file__, flush=True)
    bwd_cells.main(CELLS, bwd_cells.shipped_and(VARIANTS), bwd_cells.show_variants)
