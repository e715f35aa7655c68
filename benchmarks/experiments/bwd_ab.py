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

import fa2gen.runtime.backward as bwd
from fa2gen.bench.timing import kernel_ms
from fa2gen.generator.spec import TuningParams
from fa2gen.runtime.dispatch import select_params

CELLS = [(128, 4096, False), (128, 16384, False), (128, 4096, True), (128, 16384, True), (64, 4096, True)]
VARIANTS = {
    "64x64 g2": TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=2, loads="tma_host", gluon=2),
}


def cell(d: int, n: int, causal: bool, dtype: str) -> dict:
    c = bwd_cells.Cell(d, n, causal, dtype)
    shipped = select_params(c.problem, c.device, direction="bwd")
    row = {"cell": f"{dtype} D={d} N={n} {'causal' if causal else 'full'}", "shipped": shipped.label(),
           "ms": {}, "ok": {}, "split": {}}
    for name, params in [("shipped", shipped), *VARIANTS.items()]:
        kept = bwd.BackwardLaunch(c.problem, params)
        row["ok"][name], _, row["ms"][name] = c.check_and_time(kept)
        split = kernel_ms(lambda: c.run(kept), ("attn_bwd_delta", "attn_bwd_dkdv", "attn_bwd_dq", "nvjet"))
        row["split"][name] = {"dkdv": split.pop("attn_bwd_dkdv", 0.0), "dq": split.pop("attn_bwd_dq", 0.0),
                              "matmul": split.pop("nvjet", 0.0), "delta": split.pop("attn_bwd_delta", 0.0),
                              "other": sum(split.values())}
    row["cudnn_ms"] = c.cudnn_ms()
    return row


def show(row: dict) -> str:
    lines = [f"{row['cell']} (shipped: {row['shipped']}) cuDNN {row['cudnn_ms']:.3f} ms:"]
    for k, v in row["ms"].items():
        s = row["split"][k]
        lines.append(f"    {k:14s} {v:7.3f} ms  x cuDNN {row['cudnn_ms'] / v:.3f}{'' if row['ok'][k] else ' FAIL'}  "
                     + " ".join(f"{a} {b:.3f}" for a, b in s.items() if b))
    return "\n".join(lines)


if __name__ == "__main__":
    bwd_cells.main(CELLS, cell, show)
