"""How fast the L2 takes a one-pass backward's dQ reductions (perf-notes v42): fp32 tiles added
into a (B*H, N, D) sum the way a dK/dV kernel that also computes dQ would add them.

A program stands for one key block of one head: it walks every query block of its head and
adds a (BLOCK_Q, D) fp32 tile into those rows of the sum, so each row receives N / KEYS
additions, KEYS being the keys a program owns. Forms:
- "v4": the tile in its natural layout, four contiguous fp32 a thread: Triton emits
  atom.global.add.v4.f32 on sm90 (checked on the PTX, printed with the results);
- "scalar": the same additions with the tile's columns permuted, so that no two values of a
  thread are contiguous: one fp32 atomic each (what v32's dQ^T layout gave);
- "store": plain stores of the same tiles (no reduction), the bandwidth ceiling.
Each is timed with do_bench (L2 flushed, median); the bytes counted are the fp32 payload.

usage: python benchmarks/experiments/dq_reduce.py --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import re

import torch
import triton
import triton.language as tl

B_H, N, D, BLOCK_Q = 64, 4096, 128, 64  # fp16 D=128 N=4k of the canonical grid: B=4, H=16


@triton.jit
def add_tiles(SUM, N, KEYS: tl.constexpr, D: tl.constexpr, BLOCK_Q: tl.constexpr, FORM: tl.constexpr):
    kb = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    base = SUM + bh * N * D
    if FORM == 1:  # the columns permuted (33 is odd: a bijection mod D): no two neighbours contiguous
        offs = tl.arange(0, BLOCK_Q)[:, None] * D + (tl.arange(0, D)[None, :] * 33) % D
        value = (tl.arange(0, BLOCK_Q)[:, None] + tl.arange(0, D)[None, :] + kb).to(tl.float32)
    else:
        offs = tl.arange(0, BLOCK_Q)[:, None] * D + tl.arange(0, D)[None, :]
        value = (tl.arange(0, BLOCK_Q)[:, None] + tl.arange(0, D)[None, :] + kb).to(tl.float32)
    for q0 in range(0, N, BLOCK_Q):
        if FORM == 2:
            tl.store(base + q0 * D + offs, value)
        else:
            tl.atomic_add(base + q0 * D + offs, value, sem="relaxed")


FORMS = {"v4": 0, "scalar": 1, "store": 2}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    total = torch.zeros((B_H, N, D), dtype=torch.float32, device="cuda")
    rows = []
    for keys in (64, 128):
        grid = (N // keys, B_H)
        payload = grid[0] * grid[1] * N * D * 4  # bytes added: every program adds its head's N x D
        for form, code in FORMS.items():
            run = lambda: add_tiles[grid](total, N, KEYS=keys, D=D, BLOCK_Q=BLOCK_Q, FORM=code, num_warps=4)  # noqa: E731
            ptx = run().asm["ptx"]  # (a launch returns the compiled kernel)
            ms = triton.testing.do_bench(run, warmup=5, rep=50, return_mode="median")
            ops = sorted(set(re.findall(r"\b(?:atom|red)\.global[\w.]*", ptx)))
            rows.append({"keys": keys, "form": form, "ms": ms, "payload_gb": payload / 1e9,
                         "tb_s": payload / ms / 1e9, "ptx_atomics": ops})
            print(f"keys {keys:3d} {form:6s} {ms:7.3f} ms  {payload / 1e9:5.2f} GB  {payload / ms / 1e9:5.2f} TB/s"
                  + (f"  {ops}" if ops else ""), flush=True)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "shape": [B_H, N, D], "block_q": BLOCK_Q,
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
