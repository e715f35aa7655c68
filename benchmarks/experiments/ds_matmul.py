"""dq_mode "matmul" (perf-notes v36) against the shipped backward, cell by cell.

For each cell: the shipped backward params (what attention()'s backward dispatched before v36), and the
same dK/dV tiles with gluon=1 and dq_mode="matmul" (the Gluon dK/dV kernel stores dS, dQ is one
batched matmul; 64 x 64 where the shipped tiles are the Triton kernels'), and the matmul form on
128 x 32 tiles ("wide"). Each is checked by flash-attention's rule against an fp32 reference (outputs
poisoned with NaN first) on a sub-batch, then timed with do_bench (L2 flushed, median) next to
SDPA cuDNN's backward in the same process; the kernel split of the matmul form comes from the
PyTorch profiler.

usage: python benchmarks/experiments/ds_matmul.py --out OUT.json [--dtype fp16]
"""

from __future__ import annotations

import yaml
import bwd_cells

from fa2gen.bench.timing import kernel_ms
from fa2gen.generator.spec import TuningParams, unsupported
from fa2gen.runtime.backward import BackwardLaunch

# The shipped backward configs, read past their template hash (v36 changed the Gluon backward
# template, but not the kernels of dq_mode "separate", which its DS_OUT constexpr leaves as they were).
with open("tuned_configs/sm90/NVIDIA_H200.yaml") as f:
    SHIPPED = {e["bucket"]: e["params"] for e in yaml.safe_load(f)["entries"]}
CELLS = [(128, 1024, False), (128, 2048, False), (128, 4096, False), (128, 16384, False), (128, 4096, True),
         (64, 4096, False), (64, 4096, True)]


def cell(d: int, n: int, causal: bool, dtype: str) -> dict:
    c = bwd_cells.Cell(d, n, causal, dtype)
    shipped = TuningParams.from_dict(SHIPPED[f"bwd/{dtype}/d{d}/{'causal' if causal else 'none'}/sc0/g1/q{n}/k{n}/"
                                             f"bh{c.case.batch * c.case.heads}"])
    matmul = shipped.replace(gluon=1, dq_mode="matmul")
    if unsupported(c.problem.kernel_spec("bwd"), matmul):  # a Triton winner's tiles: the Gluon default's
        matmul = TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=2, loads="tma_host", dq_mode="matmul",
                              gluon=1)
    wide = TuningParams(block_m=128, block_n=32, num_warps=8, num_stages=2, loads="tma_host", dq_mode="matmul", gluon=1)
    row = {"cell": f"{dtype} D={d} N={n} {'causal' if causal else 'full'}", "shipped": shipped.label(),
           "matmul": matmul.label(), "wide": wide.label()}
    for name, params in (("shipped", shipped), ("matmul", matmul), ("wide", wide)):
        kept = BackwardLaunch(c.problem, params)
        row[f"{name}_ok"], verdict, row[f"{name}_ms"] = c.check_and_time(kept)
        if verdict is not None:
            row[f"{name}_verdict"] = verdict
        if name == "matmul":
            row["matmul_split"] = kernel_ms(lambda: c.run(kept), ("attn_bwd_delta", "attn_bwd_dkdv"))
    row["cudnn_ms"] = c.cudnn_ms()
    return row


def show(row: dict) -> str:
    return (f"{row['cell']:26s} shipped {row['shipped_ms']:7.3f} ms ({row['shipped']}, ok {row['shipped_ok']})  "
            f"matmul {row['matmul_ms']:7.3f} ms (ok {row['matmul_ok']})  wide {row['wide_ms']:7.3f} (ok {row['wide_ok']})  "
            f"cuDNN {row['cudnn_ms']:7.3f}  x cuDNN {row['cudnn_ms'] / row['shipped_ms']:.3f} -> "
            f"{row['cudnn_ms'] / row['matmul_ms']:.3f} / {row['cudnn_ms'] / row['wide_ms']:.3f}  "
            f"split {({k: round(v, 3) for k, v in row['matmul_split'].items()})}")


if __name__ == "__main__":
    bwd_cells.main(CELLS, cell, show)
