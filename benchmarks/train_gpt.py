"""Train a small GPT-style model with fa2gen attention and with SDPA, side by side.

Random initialisation, synthetic tokens (a fixed random Markov chain, so there is something
to learn), the same seed and batches for both runs. Reports both loss curves, the largest
gap between them, and tokens/s. Writes JSON and prints a short table.

GPU:  python benchmarks/train_gpt.py --out train.json
CPU smoke run (Triton's interpreter, tiny model): add --tiny
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time


def build_model(vocab, dim, heads, layers, seq, attention):
    import torch
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv, self.proj = nn.Linear(dim, 3 * dim, bias=False), nn.Linear(dim, dim, bias=False)
            self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

        def forward(self, x):
            b, n, _ = x.shape
            # (B, N, 3, H, D) viewed as (B, H, N, D) without copies: strided inputs
            q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, heads, dim // heads).unbind(2)
            y = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            x = x + self.proj(y.transpose(1, 2).reshape(b, n, dim))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

        def forward(self, idx):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln(x))

    return GPT()


def batches(vocab, seq, batch, steps, seed, successors=8):
    """Token sequences from a random sparse Markov chain (each token has a few weighted
    successors): a fixed distribution with a known floor to learn towards. All steps'
    sequences are drawn together, one small sampling call per position."""
    import torch

    g = torch.Generator().manual_seed(seed)
    nxt = torch.randint(vocab, (vocab, successors), generator=g)
    probs = torch.softmax(torch.randn(vocab, successors, generator=g) * 2, -1)
    x = torch.empty(steps * batch, seq + 1, dtype=torch.long)
    x[:, 0] = torch.randint(vocab, (steps * batch,), generator=g)
    for t in range(seq):
        pick = torch.multinomial(probs[x[:, t]], 1, generator=g).squeeze(1)
        x[:, t + 1] = nxt[x[:, t], pick]
    return x.view(steps, batch, seq + 1)


def run(name, attention, cfg, data, device, dtype):
    import torch

    torch.manual_seed(cfg["seed"])
    model = build_model(cfg["vocab"], cfg["dim"], cfg["heads"], cfg["layers"], cfg["seq"], attention).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"])
    losses, tokens, elapsed = [], 0, 0.0
    for step, xy in enumerate(data):
        xy = xy.to(device)
        x, y = xy[:, :-1], xy[:, 1:]
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype, enabled=device.type == "cuda"):
            logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, cfg["vocab"]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if step >= cfg["warmup"]:  # compile and first-call costs excluded from throughput
            elapsed += time.perf_counter() - t0
            tokens += x.numel()
        losses.append(float(loss.detach()))
        if step % 50 == 0:
            print(f"{name} step {step}: loss {losses[-1]:.4f}", flush=True)
    return {"name": name, "losses": losses, "tokens_per_s": tokens / elapsed if elapsed else float("nan")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run under Triton's interpreter")
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    if args.tiny:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch
    import torch.nn.functional as F

    import fa2gen

    device = torch.device("cpu" if args.tiny else "cuda")
    dtype = torch.bfloat16
    if args.tiny:
        cfg = dict(vocab=64, dim=64, heads=2, layers=2, seq=48, batch=2, steps=args.steps, lr=3e-3, seed=0, warmup=1)
    else:
        cfg = dict(
            vocab=4096, dim=1024, heads=8, layers=4, seq=2048, batch=8, steps=args.steps, lr=6e-4, seed=0, warmup=10
        )

    def ours(q, k, v):
        if not args.tiny:
            return fa2gen.attention(q, k, v, causal=True)
        # the interpreter computes in the inputs' dtype; the tiny run keeps bf16 like the GPU run
        return fa2gen.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), causal=True).to(q.dtype)

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    data = batches(cfg["vocab"], cfg["seq"], cfg["batch"], cfg["steps"], cfg["seed"])
    runs = [run("fa2gen", ours, cfg, data, device, dtype), run("sdpa", sdpa, cfg, data, device, dtype)]
    a, b = runs[0]["losses"], runs[1]["losses"]
    tail = max(1, len(a) // 10)
    result = {
        "config": cfg,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "runs": runs,
        "max_abs_loss_gap": max(abs(x - y) for x, y in zip(a, b)),
        "final_loss_mean_last_10pct": {r["name"]: sum(r["losses"][-tail:]) / tail for r in runs},
        "initial_loss": a[0],
        "uniform_loss": math.log(cfg["vocab"]),
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{'step':>6} {'fa2gen':>8} {'sdpa':>8}")
    for i in range(0, len(a), max(1, len(a) // 10)):
        print(f"{i:6d} {a[i]:8.4f} {b[i]:8.4f}")
    print(
        f"final (mean of last 10%): fa2gen {result['final_loss_mean_last_10pct']['fa2gen']:.4f}, "
        f"sdpa {result['final_loss_mean_last_10pct']['sdpa']:.4f}; max |gap| {result['max_abs_loss_gap']:.4f}"
    )
    print(f"tokens/s: fa2gen {runs[0]['tokens_per_s']:.0f}, sdpa {runs[1]['tokens_per_s']:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
