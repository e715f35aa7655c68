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

import argparse
import json

import torch
import yaml
from torch.nn.attention import SDPBackend, sdpa_kernel

from fa2gen.bench.correctness import check_backward
from fa2gen.bench.grid import Case, make_inputs
from fa2gen.bench.timing import kernel_ms, measure
from fa2gen.generator.spec import TuningParams, unsupported
from fa2gen.runtime.backward import BackwardLaunch
from fa2gen.runtime.device import cuda_device_info
from fa2gen.runtime.dispatch import select_params
from fa2gen.runtime.launch import forward
from fa2gen.runtime.problem import make_problem

# The shipped backward configs, read past their template hash (v36 changed the Gluon backward
# template, but not the kernels of dq_mode "separate", which its DS_OUT constexpr leaves as they were).
with open("tuned_configs/sm90/NVIDIA_H200.yaml") as f:
    SHIPPED = {e["bucket"]: e["params"] for e in yaml.safe_load(f)["entries"]}
CELLS = [(128, 1024, False), (128, 2048, False), (128, 4096, False), (128, 16384, False), (128, 4096, True),
         (64, 4096, False), (64, 4096, True)]
CHECKED = 4096  # the reference check up to this length (the GPU tests cover correctness; this guards the timing)


def cell(d: int, n: int, causal: bool, dtype: str) -> dict:
    case = Case(16384 // n, 2048 // d, n, d, causal, dtype)
    q, k, v = make_inputs(case, torch.device("cuda"))
    problem = make_problem(q, k, v, causal=causal)
    dev = cuda_device_info(torch.cuda.current_device())
    out, lse = forward(q, k, v, problem, select_params(problem, dev))
    dout = torch.randn_like(out)
    shipped = TuningParams.from_dict(SHIPPED[f"bwd/{dtype}/d{d}/{'causal' if causal else 'none'}/sc0/g1/q{n}/k{n}/"
                                             f"bh{case.batch * case.heads}"])
    matmul = shipped.replace(gluon=1, dq_mode="matmul")
    if unsupported(problem.kernel_spec("bwd"), matmul):  # a Triton winner's tiles: the Gluon default's
        matmul = TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=2, loads="tma_host", dq_mode="matmul",
                              gluon=1)
    wide = TuningParams(block_m=128, block_n=32, num_warps=8, num_stages=2, loads="tma_host", dq_mode="matmul", gluon=1)
    row = {"cell": f"{dtype} D={d} N={n} {'causal' if causal else 'full'}", "shipped": shipped.label(),
           "matmul": matmul.label(), "wide": wide.label()}
    for name, params in (("shipped", shipped), ("matmul", matmul), ("wide", wide)):
        kept = BackwardLaunch(problem, params)
        grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
        kept.run(q, k, v, out, lse, dout, dq=grads[0], dk=grads[1], dv=grads[2])
        if n <= CHECKED:
            b = min(case.batch, 2)  # the reference on a sub-batch keeps its memory small
            verdict = check_backward(q[:b], k[:b], v[:b], make_problem(q[:b], k[:b], v[:b], causal=causal),
                                     dout[:b], grads[0][:b], grads[1][:b], grads[2][:b])
            row[f"{name}_ok"] = verdict.ok
            row[f"{name}_verdict"] = str(verdict)
        else:
            row[f"{name}_ok"] = not any(torch.isnan(g).any().item() for g in grads)  # NaN-free only
        row[f"{name}_ms"] = measure(lambda: kept.run(q, k, v, out, lse, dout)).median_ms
        if name == "matmul":
            row["matmul_split"] = kernel_ms(lambda: kept.run(q, k, v, out, lse, dout), ("attn_bwd_delta", "attn_bwd_dkdv"))
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
        row["cudnn_ms"] = measure(lambda: torch.autograd.grad(o, (qg, kg, vg), dout, retain_graph=True)).median_ms
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="fp16")
    args = ap.parse_args()
    rows = []
    for d, n, causal in CELLS:
        row = cell(d, n, causal, args.dtype)
        rows.append(row)
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "dtype": args.dtype, "rows": rows}, f, indent=1)
        print(f"{row['cell']:26s} shipped {row['shipped_ms']:7.3f} ms ({row['shipped']}, ok {row['shipped_ok']})  "
              f"matmul {row['matmul_ms']:7.3f} ms (ok {row['matmul_ok']})  wide {row['wide_ms']:7.3f} (ok {row['wide_ok']})  cuDNN {row['cudnn_ms']:7.3f}  "
              f"x cuDNN {row['cudnn_ms'] / row['shipped_ms']:.3f} -> {row['cudnn_ms'] / row['matmul_ms']:.3f} / "
              f"{row['cudnn_ms'] / row['wide_ms']:.3f}  "
              f"split {({k: round(v, 3) for k, v in row['matmul_split'].items()})}", flush=True)


if __name__ == "__main__":
    main()
