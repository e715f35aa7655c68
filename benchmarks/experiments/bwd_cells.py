"""What the backward experiments share: one canonical-grid cell's inputs and forward, a kept
backward launch checked (outputs poisoned with NaN first) and timed, and SDPA cuDNN's backward
timed in the same process; a row of variants each checked, timed and split into its kernels.
Imported by ds_matmul.py, causal_bands.py, d64_tiles.py and bwd_ab.py (run as scripts, this
folder is on their path)."""

from __future__ import annotations

import argparse
import json

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from fa2gen.bench.correctness import check_backward
from fa2gen.bench.grid import Case, make_inputs
from fa2gen.bench.timing import kernel_ms, measure
from fa2gen.generator.spec import unsupported
from fa2gen.runtime.device import cuda_device_info
from fa2gen.runtime.dispatch import select_params
from fa2gen.runtime.backward import BackwardLaunch
from fa2gen.runtime.launch import forward
from fa2gen.runtime.problem import make_problem

CHECKED = 4096  # the reference check up to this length (the GPU tests cover correctness; this guards the timing)


class Cell:
    """A canonical-grid cell (B*N = 16k, H = 2048 / D) with fresh inputs, the shipped forward's
    output and LSE, and an output gradient."""

    def __init__(self, d: int, n: int, causal: bool, dtype: str):
        self.case = Case(16384 // n, 2048 // d, n, d, causal, dtype)
        self.causal, self.n = causal, n
        self.q, self.k, self.v = make_inputs(self.case, torch.device("cuda"))
        self.problem = make_problem(self.q, self.k, self.v, causal=causal)
        self.device = cuda_device_info(torch.cuda.current_device())
        self.out, self.lse = forward(self.q, self.k, self.v, self.problem, select_params(self.problem, self.device))
        self.dout = torch.randn_like(self.out)

    def run(self, kept, **grads):
        return kept.run(self.q, self.k, self.v, self.out, self.lse, self.dout, **grads)

    def check_and_time(self, kept) -> tuple[bool, str | None, float]:
        """(ok, verdict, median ms) of a kept BackwardLaunch: checked by flash-attention's rule
        on a sub-batch up to CHECKED queries (NaN-free only beyond), then timed."""
        q, k, v = self.q, self.k, self.v
        dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
        self.run(kept, dq=dq, dk=dk, dv=dv)
        if self.n <= CHECKED:
            b = min(self.case.batch, 2)  # the reference on a sub-batch keeps its memory small
            verdict = check_backward(q[:b], k[:b], v[:b], make_problem(q[:b], k[:b], v[:b], causal=self.causal),
                                     self.dout[:b], dq[:b], dk[:b], dv[:b])
            ok, said = verdict.ok, str(verdict)
        else:
            ok, said = not any(torch.isnan(g).any().item() for g in (dq, dk, dv)), None
        return ok, said, measure(lambda: self.run(kept)).median_ms

    def cudnn_ms(self) -> float:
        """SDPA cuDNN's backward on the same inputs and output gradient (median ms)."""
        qg, kg, vg = (t.detach().requires_grad_() for t in (self.q, self.k, self.v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=self.causal)
            return measure(lambda: torch.autograd.grad(o, (qg, kg, vg), self.dout, retain_graph=True)).median_ms


def variants_row(c: Cell, title: str, variants, **fields) -> dict:
    """Each (name, params) of ``variants`` on cell ``c``: checked, timed and split into its
    kernels by the profiler (ms per call: dK/dV, dQ (any kernel named attn_bwd_dq*: from v45
    on also dq_mode matmul's), cuBLAS's dQ matmul (dq_mode matmul before v45), delta, the rest), with
    cuDNN's backward timed after them; a row for show_variants, holding ``fields`` too."""
    row = {"cell": title, **fields, "ms": {}, "ok": {}, "split": {}}
    for name, params in variants:
        kept = BackwardLaunch(c.problem, params)
        row["ok"][name], _, row["ms"][name] = c.check_and_time(kept)
        split = kernel_ms(lambda: c.run(kept), ("attn_bwd_delta", "attn_bwd_dkdv", "attn_bwd_dq", "nvjet"))
        row["split"][name] = {"dkdv": split.pop("attn_bwd_dkdv", 0.0), "dq": split.pop("attn_bwd_dq", 0.0),
                              "matmul": split.pop("nvjet", 0.0), "delta": split.pop("attn_bwd_delta", 0.0),
                              "other": sum(split.values())}
    row["cudnn_ms"] = c.cudnn_ms()
    return row


def shipped_and(variants: dict):
    """An experiment's ``measure_cell`` for main(): on cell (D, N, causal), the shipped backward
    (the tuned configs) and each of ``variants`` (name: params) the cell's spec supports, by
    variants_row; the others are printed and listed in the row's "refused" with the reason."""
    def cell(d: int, n: int, causal: bool, dtype: str) -> dict:
        c = Cell(d, n, causal, dtype)
        shipped = select_params(c.problem, c.device, direction="bwd")
        title = f"{dtype} D={d} N={n} {'causal' if causal else 'full'}"
        spec = c.problem.kernel_spec("bwd")
        refused = {name: unsupported(spec, p) for name, p in variants.items() if unsupported(spec, p)}
        for name, why in refused.items():
            print(f"{title}: {name} not run: {why}", flush=True)
        kept = [(name, p) for name, p in variants.items() if name not in refused]
        return variants_row(c, title, [("shipped", shipped), *kept], shipped=shipped.label(), refused=refused)
    return cell


def show_variants(row: dict) -> str:
    shipped = f" (shipped: {row['shipped']})" if "shipped" in row else ""
    lines = [f"{row['cell']}{shipped} cuDNN {row['cudnn_ms']:.3f} ms:"]
    for k, v in row["ms"].items():
        s = row["split"][k]
        lines.append(f"    {k:18s} {v:7.3f} ms  x cuDNN {row['cudnn_ms'] / v:.3f}{'' if row['ok'][k] else ' FAIL'}  "
                     + " ".join(f"{a} {b:.3f}" for a, b in s.items() if b))
    return "\n".join(lines)


def main(cells, measure_cell, show) -> None:
    """An experiment's command line, ``--out OUT.json [--dtype fp16]``: ``measure_cell(*cell,
    dtype)`` for each of ``cells`` in turn, the JSON rewritten after each (a run cut short keeps
    what it measured), and ``show(row)`` printed."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="fp16")
    args = ap.parse_args()
    rows = []
    for cell in cells:
        rows.append(measure_cell(*cell, args.dtype))
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "dtype": args.dtype, "rows": rows}, f, indent=1)
        print(show(rows[-1]), flush=True)
