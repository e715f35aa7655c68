"""Where an fp8 forward call's time goes, on the fp8 D=128 canonical cells: the call as users
make it (``fa2gen.attention``, do_bench median with L2 flushed, as ``fa2gen bench`` times it),
the same call replayed from a CUDA graph (no host time), and its kernels' GPU times from the
PyTorch profiler (the attention kernel and V's staged copy, "transpose"); beside fa2gen's own
bf16 forward on the same values, timed the same three ways.

usage (GPU machine): python benchmarks/experiments/fp8_call_parts.py OUT.jsonl [N ...]
One JSON line per cell (times in ms), and a table on stdout (us), written as each cell ends.
"""

import json
import sys

import torch

import fa2gen
from fa2gen.bench.grid import Case, make_inputs
from fa2gen.bench.timing import graph_replay, kernel_ms, measure


def parts(fn, names) -> dict:
    fn()
    return {"call_ms": measure(fn).median_ms, "graph_ms": measure(graph_replay(fn)).median_ms,
            "kernels_ms": kernel_ms(fn, names)}


def main(path: str, seqlens: list[int]) -> None:
    print("cell (us)           fp8: call  graph   attn   copy | bf16: call  graph   attn | bf16/fp8: call  graph  kernels",
          flush=True)
    with open(path, "a") as f:
        for n in seqlens:
            for causal in (False, True):
                case = Case(16384 // n, 16, n, 128, causal, "fp8e4m3")
                q, k, v = make_inputs(case, torch.device("cuda"))
                qb, kb, vb = (t.to(torch.bfloat16) for t in (q, k, v))
                a = parts(lambda: fa2gen.attention(q, k, v, causal=causal), ("attn_fwd", "transpose"))
                b = parts(lambda: fa2gen.attention(qb, kb, vb, causal=causal), ("attn_fwd",))
                row = {"cell": f"D128 N{n} {'causal' if causal else 'full'}", "fp8": a, "bf16": b}
                f.write(json.dumps(row) + "\n")
                f.flush()
                nan = float("nan")
                attn, copy = a["kernels_ms"].get("attn_fwd", nan), a["kernels_ms"].get("transpose", nan)
                battn = b["kernels_ms"].get("attn_fwd", nan)
                us = [1e3 * x for x in (a["call_ms"], a["graph_ms"], attn, copy, b["call_ms"], b["graph_ms"], battn)]
                print(f"{row['cell']:18s} {us[0]:10.1f} {us[1]:6.1f} {us[2]:6.1f} {us[3]:6.1f} | {us[4]:10.1f} {us[5]:6.1f}"
                      f" {us[6]:6.1f} | {us[4] / us[0]:14.3f} {us[5] / us[1]:6.3f} {us[6] / (us[2] + us[3]):8.3f}",
                      flush=True)


if __name__ == "__main__":
    main(sys.argv[1], [int(x) for x in sys.argv[2:]] or [4096, 8192, 16384])
