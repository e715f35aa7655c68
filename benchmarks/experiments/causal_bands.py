"""dq_mode "matmul" under a causal mask (perf-notes v38): how many bands of queries, on which tiles.

For each causal cell of the canonical grid at D=128 (and D=64 N=4k): the shipped backward (the
tuned configs), and dq_mode matmul on 64 x 64 (two stages) and 64 x 32 (three stages) dK/dV
tiles with dQ's matmul in 1 to 32 bands (at least 128 queries each). Each is checked by
flash-attention's rule against an fp32 reference (outputs poisoned with NaN first) on a
sub-batch, then timed with do_bench (L2 flushed, median) next to SDPA cuDNN's backward in the
same process; the matmul forms' kernels come from the PyTorch profiler (attn_bwd_dkdv; nvjet:
cuBLAS's dQ matmuls; elementwise: the zeroing of skipped tiles and dQ's copy out of fp32).

It measures the package before v45, which replaced the bands and cuBLAS's matmuls with a
Gluon dQ kernel (attn_bwd_dq_ds): on a later one the band count it sets does nothing.

usage: python benchmarks/experiments/causal_bands.py --out OUT.json [--dtype fp16]
"""

from __future__ import annotations

import bwd_cells

import fa2gen.runtime.backward as bwd
from fa2gen.bench.timing import kernel_ms
from fa2gen.generator.spec import TuningParams
from fa2gen.runtime.dispatch import select_params

CELLS = [(128, 1024), (128, 2048), (128, 4096), (128, 16384), (64, 4096)]
TILES = {"64x64": TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=2, loads="tma_host",
                               dq_mode="matmul", gluon=1),
         "64x32": TuningParams(block_m=64, block_n=32, num_warps=4, num_stages=3, loads="tma_host",
                               dq_mode="matmul", gluon=1)}
VARIANTS = [("64x64", 1), ("64x64", 8), ("64x64", 16), ("64x64", 32), ("64x32", 16)]


def cell(d: int, n: int, dtype: str) -> dict:
    c = bwd_cells.Cell(d, n, True, dtype)
    shipped = select_params(c.problem, c.device, direction="bwd")
    row = {"cell": f"{dtype} D={d} N={n} causal", "shipped": shipped.label(), "ms": {}, "ok": {}, "split": {}}
    variants = [("shipped", shipped, 8)] + [(f"{t} bands {n_bands}", TILES[t], n_bands) for t, n_bands in VARIANTS]
    for name, params, bands in variants:
        bwd.CAUSAL_BANDS, bwd.CAUSAL_BAND_ROWS = bands, 128
        kept = bwd.BackwardLaunch(c.problem, params)
        row["ok"][name], _, row["ms"][name] = c.check_and_time(kept)
        if name != "shipped":
            split = kernel_ms(lambda: c.run(kept), ("attn_bwd_delta", "attn_bwd_dkdv", "nvjet"))
            row["split"][name] = {
                "dkdv": split.pop("attn_bwd_dkdv", 0.0), "matmul": split.pop("nvjet", 0.0),
                "delta": split.pop("attn_bwd_delta", 0.0), "other": sum(split.values())}
    row["cudnn_ms"] = c.cudnn_ms()
    return row


def show(row: dict) -> str:
    ratios = "  ".join(f"{k} {row['cudnn_ms'] / v:.3f}{'' if row['ok'][k] else ' FAIL'}" for k, v in row["ms"].items())
    splits = "".join(f"\n    {k:16s} " + " ".join(f"{a} {b:.3f}" for a, b in s.items()) for k, s in row["split"].items())
    return f"{row['cell']:22s} x cuDNN: {ratios}{splits}"


if __name__ == "__main__":
    bwd_cells.main(CELLS, cell, show)
