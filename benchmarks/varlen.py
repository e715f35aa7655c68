"""Packed batches of mixed lengths: fa2gen.attention_varlen against the dense kernel on the
same sequences, and against what users replace it with.

One batch of sequences of lengths drawn from 1 to 8192 (seeded; 1 and 8192 always in it),
about 16k tokens in all, hidden 2048 (H = 2048 / D), fp16 or bf16, causal off and on.
Providers, timed in the same run (fa2gen.bench.timing.time_in_rounds):

- fa2gen-varlen: one attention_varlen call over the packed batch;
- fa2gen-dense: fa2gen.attention once per sequence, (1, H, N_b, D) each: the dense kernel
  on the same tokens (the target: varlen at >= 0.95x its TFLOP/s);
- sdpa-flash-padded: the batch padded to its longest sequence, SDPA FLASH (FA2). With the
  causal mask padding keys are never seen by real rows, so it is exact; without, it also
  attends to the padding (a lower bound on the time of a correct padded call);
- sdpa-efficient-masked: padded, with a boolean key-padding (and causal) mask: exact;
- flex-document: compiled FlexAttention over the packed tokens with a document mask.

TFLOP/s count the useful work only: 4 * H * N_b^2 * D per sequence (half under causal); the
backward 2.5x that. Backward times are those of forward + backward less the forward.

usage: python benchmarks/varlen.py --out varlen.json [--dtypes bf16,fp16] [--dims 64,128]
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

import fa2gen
from fa2gen.bench.timing import time_in_rounds, warm_window

TOTAL = 16384
MAX_LEN = 8192


def mixed_lengths(seed: int = 0) -> list[int]:
    """Lengths from 1 to MAX_LEN summing to TOTAL, 1 and MAX_LEN among them."""
    g = torch.Generator().manual_seed(seed)
    lengths = [1, MAX_LEN]
    while sum(lengths) < TOTAL:
        lengths.append(int(torch.randint(1, MAX_LEN + 1, (1,), generator=g)))
    lengths[-1] -= sum(lengths) - TOTAL
    order = torch.randperm(len(lengths), generator=g).tolist()
    return [lengths[i] for i in order if lengths[i] > 0]


def useful_flops(lengths, heads, dim, causal) -> float:
    return sum(4 * heads * n * n * dim * (0.5 if causal else 1.0) for n in lengths)


def providers(lengths, heads, dim, dtype, causal):
    dev = "cuda"
    total = sum(lengths)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=dev)
    longest = max(lengths)
    q, k, v = (torch.randn(total, heads, dim, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
    dout = torch.randn(total, heads, dim, device=dev, dtype=dtype)

    def varlen():
        return fa2gen.attention_varlen(q, k, v, cu, cu, longest, longest, causal=causal)

    starts = cu.tolist()
    pieces = [
        [t[a:z].detach().permute(1, 0, 2).unsqueeze(0).contiguous().requires_grad_() for t in (q, k, v)]
        + [dout[a:z].permute(1, 0, 2).unsqueeze(0).contiguous()]
        for a, z in zip(starts[:-1], starts[1:])
    ]

    def dense():
        return [fa2gen.attention(a, b, c, causal=causal) for a, b, c, _ in pieces]

    def padded(t):
        out = t.new_zeros(len(lengths), heads, longest, dim)
        for i, (a, z) in enumerate(zip(starts[:-1], starts[1:])):
            out[i, :, : z - a] = t[a:z].permute(1, 0, 2)
        return out.detach().requires_grad_()

    pq, pk, pv = padded(q), padded(k), padded(v)
    pdout = padded(dout).detach()
    valid = torch.arange(longest, device=dev)[None, :] < torch.tensor(lengths, device=dev)[:, None]
    mask = valid[:, None, None, :]
    if causal:
        mask = mask & torch.ones(longest, longest, dtype=torch.bool, device=dev).tril()[None, None]

    from torch.nn.attention import SDPBackend, sdpa_kernel

    def flash():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(pq, pk, pv, is_causal=causal)

    def efficient():
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            return F.scaled_dot_product_attention(pq, pk, pv, attn_mask=mask)

    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    doc = torch.repeat_interleave(torch.arange(len(lengths), device=dev), torch.tensor(lengths, device=dev))
    pos = torch.arange(total, device=dev) - cu[:-1].long()[doc]

    def document(b, h, qi, ki):
        same = doc[qi] == doc[ki]
        return same & (pos[qi] >= pos[ki]) if causal else same

    block_mask = create_block_mask(document, B=None, H=None, Q_LEN=total, KV_LEN=total, device=dev)
    flex_fn = torch.compile(flex_attention, dynamic=False)
    fq, fk, fv = (t.detach().permute(1, 0, 2).unsqueeze(0).requires_grad_() for t in (q, k, v))
    fdout = dout.permute(1, 0, 2).unsqueeze(0)

    def flex():
        return flex_fn(fq, fk, fv, block_mask=block_mask)

    def with_backward(fwd, grads):
        def run():
            outs = fwd()
            outs = outs if isinstance(outs, list) else [outs]
            torch.autograd.backward(outs, grads)

        return run

    calls = {
        "fa2gen-varlen": (varlen, with_backward(varlen, [dout])),
        "fa2gen-dense": (dense, with_backward(dense, [p[3] for p in pieces])),
        "sdpa-flash-padded": (flash, with_backward(flash, [pdout])),
        "sdpa-efficient-masked": (efficient, with_backward(efficient, [pdout])),
        "flex-document": (flex, with_backward(flex, [fdout])),
    }
    return calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    lengths = mixed_lengths(args.seed)
    meta = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "lengths": lengths,
    }
    rows = []
    for dtype_name in args.dtypes.split(","):
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
        for dim in map(int, args.dims.split(",")):
            heads = 2048 // dim
            for causal in (False, True):
                calls = providers(lengths, heads, dim, dtype, causal)
                for name, (f, fb) in calls.items():  # compile and warm every provider first
                    try:
                        f(), fb()
                    except Exception as e:
                        calls[name] = e
                live = {n: c for n, c in calls.items() if not isinstance(c, Exception)}
                fwd = time_in_rounds({n: c[0] for n, c in live.items()}, warm_window)
                both = time_in_rounds({n: c[1] for n, c in live.items()}, warm_window)
                flops = useful_flops(lengths, heads, dim, causal)
                row = {"dtype": dtype_name, "head_dim": dim, "heads": heads, "causal": causal, "providers": {}}
                for name, c in calls.items():
                    err = next((e for e in (c, fwd.get(name), both.get(name)) if isinstance(e, Exception)), None)
                    if err is not None:
                        row["providers"][name] = {"error": f"{type(err).__name__}: {str(err)[:160]}"}
                        continue
                    f_ms, b_ms = fwd[name][1], both[name][1] - fwd[name][1]
                    row["providers"][name] = {
                        "fwd_ms": fwd[name],
                        "fwdbwd_ms": both[name],
                        "fwd_tflops": flops / (f_ms * 1e-3) / 1e12,
                        "bwd_tflops": 2.5 * flops / (b_ms * 1e-3) / 1e12,
                    }
                rows.append(row)
                print(json.dumps(row), flush=True)
                with open(args.out, "w") as f:  # after every row: a run cut short keeps its rows
                    json.dump({**meta, "rows": rows}, f, indent=1)
    names = list(rows[0]["providers"])
    print("lengths:", lengths)
    print(f"{'dtype':5} {'D':>4} {'causal':6} {'dir':3} " + " ".join(f"{n:>22}" for n in names))
    for r in rows:
        for d in ("fwd", "bwd"):
            cells = []
            for n in names:
                p = r["providers"][n]
                cells.append(f"{p[d + '_tflops']:22.1f}" if "error" not in p else f"{'error':>22}")
            print(f"{r['dtype']:5} {r['head_dim']:4d} {str(r['causal']):6} {d:3} " + " ".join(cells))
    for r in rows:
        p = r["providers"]
        if "error" in p["fa2gen-varlen"] or "error" in p["fa2gen-dense"]:
            continue
        print(
            f"{r['dtype']} D{r['head_dim']} causal={r['causal']}: varlen/dense fwd "
            f"{p['fa2gen-varlen']['fwd_tflops'] / p['fa2gen-dense']['fwd_tflops']:.3f} bwd "
            f"{p['fa2gen-varlen']['bwd_tflops'] / p['fa2gen-dense']['bwd_tflops']:.3f}"
        )


if __name__ == "__main__":
    main()
