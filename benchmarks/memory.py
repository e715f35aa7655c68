"""Peak GPU memory of one forward + backward pass against sequence length.

fa2gen keeps O and the log-sum-exp for the backward, so its peak should grow linearly
in N; SDPA's math backend materialises the N x N scores. Measures
torch.cuda.max_memory_allocated above the inputs, at N = 4k, 8k, 16k and 32k (B=1,
H=16, D=128, causal, bf16). Writes JSON and prints a table.

usage: python benchmarks/memory.py --out memory.json
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

import fa2gen


def peak_bytes(fn, q, k, v, dout) -> int | str:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    try:
        out = fn(q, k, v)
        out.backward(dout)
        torch.cuda.synchronize()
    except torch.OutOfMemoryError:
        return "out of memory"
    finally:
        q.grad = k.grad = v.grad = None
    return torch.cuda.max_memory_allocated() - base


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seqlens", default="4096,8192,16384,32768")
    args = ap.parse_args()

    def ours(q, k, v):
        return fa2gen.attention(q, k, v, causal=True)

    def math_backend(q, k, v):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    rows = []
    for n in map(int, args.seqlens.split(",")):
        q, k, v = (
            torch.randn(1, 16, n, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)
        )
        dout = torch.randn(1, 16, n, 128, device="cuda", dtype=torch.bfloat16)
        inputs = 3 * q.numel() * q.element_size()
        row = {"seqlen": n, "inputs_bytes": inputs}
        for name, fn in (("fa2gen", ours), ("sdpa-math", math_backend)):
            row[name] = peak_bytes(fn, q, k, v, dout)
        rows.append(row)
        print(json.dumps(row), flush=True)
        del q, k, v, dout
    with open(args.out, "w") as f:
        json.dump(
            {"device": torch.cuda.get_device_name(), "shape": "B=1 H=16 D=128 causal bf16", "rows": rows}, f, indent=1
        )
    print(f"{'N':>6} {'fa2gen MiB':>11} {'per token KiB':>14} {'sdpa-math MiB':>14}")
    for r in rows:
        mine, other = r["fa2gen"], r["sdpa-math"]

        def fmt(x):
            return f"{x / 2**20:11.1f}" if isinstance(x, int) else f"{x:>11}"

        per = f"{mine / r['seqlen'] / 1024:14.2f}" if isinstance(mine, int) else "-"
        print(f"{r['seqlen']:6d} {fmt(mine)} {per} {fmt(other):>14}")


if __name__ == "__main__":
    main()
