"""How far fp8 attention is from the truth: fa2gen's e4m3 forward against fp32 attention on
the unquantized inputs, next to fa2gen's bf16 forward on the same inputs.

Inputs are fresh random normal fp32 tensors at canonical-grid shapes (B*N = 16k tokens,
H = 2048 / D). They are quantized to e4m3 with a per-tensor factor (amax / 448), and again
with one factor per (batch, head). The reference is SDPA's memory-efficient backend in fp32
on the unquantized tensors (no N x N matrix). Each fp8 output is also judged by fa2gen's fp8
rule, which compares it with the same attention over the dequantized values
(fa2gen.bench.correctness).

usage: python benchmarks/fp8_accuracy.py [--head-dims 64,128] [--seqlens 4096,16384] [--out r.json]
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

import fa2gen
from fa2gen.bench.correctness import check_forward
from fa2gen.runtime.fp8 import check_descales
from fa2gen.runtime.problem import make_problem

F8 = torch.float8_e4m3fn


def quantize(x: torch.Tensor, per_head: bool):
    amax = x.abs().amax(dim=(2, 3)) if per_head else x.abs().amax()
    scale = (amax / 448.0).float()
    return (x / (scale[:, :, None, None] if per_head else scale)).to(F8), scale


def errors(out: torch.Tensor, ref: torch.Tensor) -> dict:
    d = (out.float() - ref).abs()
    return {
        "max": d.max().item(),
        "mean": d.mean().item(),
        "rel_rms": (d.square().mean() / ref.square().mean()).sqrt().item(),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--seqlens", default="4096,16384")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for d in map(int, args.head_dims.split(",")):
        for n in map(int, args.seqlens.split(",")):
            for causal in (False, True):
                b, h = max(1, 16384 // n), 2048 // d
                g = torch.Generator(device="cuda").manual_seed(n + d)
                x = [torch.randn(b, h, n, d, device="cuda", generator=g) for _ in range(3)]
                from torch.nn.attention import SDPBackend, sdpa_kernel

                with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
                    ref = F.scaled_dot_product_attention(*x, is_causal=causal)
                row = {
                    "D": d,
                    "N": n,
                    "B": b,
                    "H": h,
                    "causal": causal,
                    "bf16": errors(fa2gen.attention(*(t.bfloat16() for t in x), causal=causal), ref),
                }
                for per_head in (False, True):
                    q8, k8, v8 = (quantize(t, per_head) for t in x)
                    scales = (q8[1], k8[1], v8[1])
                    out, lse = fa2gen.attention(
                        q8[0],
                        k8[0],
                        v8[0],
                        causal=causal,
                        return_lse=True,
                        descale_q=scales[0],
                        descale_k=scales[1],
                        descale_v=scales[2],
                    )
                    problem = make_problem(q8[0], k8[0], v8[0], causal=causal)
                    verdict = check_forward(
                        q8[0], k8[0], v8[0], problem, out, lse, descales=check_descales(problem, out.device, *scales)
                    )
                    key = "fp8_per_head" if per_head else "fp8_per_tensor"
                    row[key] = {**errors(out, ref), "rule": str(verdict), "rule_ok": verdict.ok}
                rows.append(row)
                print(
                    f"D={d} N={n} {'causal' if causal else 'full'}: "
                    + ", ".join(
                        f"{k} max {row[k]['max']:.2e} rel-rms {row[k]['rel_rms']:.2e}"
                        for k in ("bf16", "fp8_per_tensor", "fp8_per_head")
                    )
                    + f"; fp8 rule {row['fp8_per_tensor']['rule_ok']}/{row['fp8_per_head']['rule_ok']}",
                    flush=True,
                )
                del x, ref
                torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
