"""A Llama-style model under Hugging Face transformers with attn_implementation="fa2gen" against
"sdpa" (and "eager", as the size of PyTorch's own disagreements), in one run on one GPU.

Model: 4 layers, hidden 2048, 16 query heads over 4 k/v heads (GQA), bf16, random weights
(seeded); both implementations hold the same weights.

- logits on an unpadded and a left-padded batch: the largest difference over the largest
  logit, at real tokens;
- one training step's gradients: the largest relative norm of a parameter's gradient
  difference;
- greedy generate(): on the random weights, where near-ties decide many tokens, and on the same
  model after training it to copy its prompt, where every token is a confident prediction: the
  tokens that agree and the sequences that come out identical;
- tokens/s of training steps (forward, backward, AdamW) and of generation, both ways.

usage: python benchmarks/hf_llama.py --out hf.json [--train-steps 300]
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch
import transformers

import fa2gen.integrations.transformers as fa2gen_hf

CONFIG = dict(
    vocab_size=32000,
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=4,
    num_attention_heads=16,
    num_key_value_heads=4,
    max_position_embeddings=4096,
)
IMPLS = ("fa2gen", "sdpa", "eager")


def models(seed: int = 0) -> dict:
    fa2gen_hf.register()
    config = transformers.LlamaConfig(**CONFIG)
    torch.manual_seed(seed)
    first = None
    out = {}
    for impl in IMPLS:
        m = transformers.AutoModelForCausalLM.from_config(
            copy.deepcopy(config), attn_implementation=impl, dtype=torch.bfloat16
        ).cuda()
        if first is None:
            first = m.state_dict()
        else:
            m.load_state_dict(first)
        out[impl] = m
    return out


def logits_gap(ms: dict, ids, mask) -> dict:
    with torch.no_grad():
        got = {impl: m(input_ids=ids, attention_mask=mask).logits.float() for impl, m in ms.items()}
    real = mask.bool()
    ref = got["sdpa"][real]
    scale = ref.abs().max().item()
    return {impl: round((got[impl][real] - ref).abs().max().item() / scale, 5) for impl in ("fa2gen", "eager")}


def grad_gap(ms: dict, ids) -> dict:
    grads = {}
    for impl, m in ms.items():
        m.zero_grad(set_to_none=True)
        m(input_ids=ids, labels=ids).loss.backward()
        grads[impl] = {n: p.grad.float() for n, p in m.named_parameters()}
        m.zero_grad(set_to_none=True)
    ref = grads["sdpa"]
    return {
        impl: round(max(((grads[impl][n] - g).norm() / g.norm().clamp_min(1e-12)).item() for n, g in ref.items()), 5)
        for impl in ("fa2gen", "eager")
    }


def greedy(ms: dict, prompts, new_tokens: int) -> dict:
    outs = {}
    for impl, m in ms.items():
        with torch.no_grad():
            outs[impl] = m.generate(
                input_ids=prompts,
                attention_mask=torch.ones_like(prompts),
                max_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
            )[:, prompts.shape[1] :]
    ref = outs["sdpa"]
    return {
        impl: {
            "tokens_agreeing": int((outs[impl] == ref).sum()),
            "tokens": ref.numel(),
            "sequences_identical": int((outs[impl] == ref).all(dim=1).sum()),
            "sequences": ref.shape[0],
        }
        for impl in ("fa2gen", "eager")
    }


def copy_batch(g, batch: int, half: int, alphabet: int):
    """Random tokens, then the same tokens again: the second half is predictable exactly."""
    first = torch.randint(10, 10 + alphabet, (batch, half), generator=g, device="cuda")
    return torch.cat([first, first], dim=1)


def train_copy(m, steps: int, half: int, alphabet: int) -> list[float]:
    g = torch.Generator(device="cuda").manual_seed(1)
    opt = torch.optim.AdamW(m.parameters(), lr=5e-4, weight_decay=0.0)
    losses = []
    m.train()
    for _ in range(steps):
        ids = copy_batch(g, 16, half, alphabet)
        labels = ids.clone()
        labels[:, : half + 1] = -100  # (only the copy is learnt: the first half is noise)
        loss = m(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    m.eval()
    return losses


def train_rate(m, batch: int, seqlen: int, steps: int = 20, warmup: int = 5) -> float:
    g = torch.Generator(device="cuda").manual_seed(2)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-5)
    m.train()
    for i in range(warmup + steps):
        if i == warmup:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        ids = torch.randint(0, CONFIG["vocab_size"], (batch, seqlen), generator=g, device="cuda")
        m(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    m.eval()
    return batch * seqlen * steps / (time.perf_counter() - t0)


def generate_rate(m, batch: int, prompt: int, new_tokens: int, repeats: int = 3) -> float:
    g = torch.Generator(device="cuda").manual_seed(3)
    ids = torch.randint(0, CONFIG["vocab_size"], (batch, prompt), generator=g, device="cuda")
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0, min_new_tokens=new_tokens)
    with torch.no_grad():
        m.generate(input_ids=ids, max_new_tokens=8, **{**kw, "min_new_tokens": 8})
        best = float("inf")
        for _ in range(repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            m.generate(input_ids=ids, max_new_tokens=new_tokens, **kw)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
    return batch * new_tokens / best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--train-steps", type=int, default=500)
    args = ap.parse_args()
    ms = models()
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "transformers": transformers.__version__,
        "model": CONFIG,
    }
    g = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(0, CONFIG["vocab_size"], (4, 512), generator=g, device="cuda")
    mask = torch.ones_like(ids)
    result["logits_unpadded"] = logits_gap(ms, ids, mask)
    for row, pad in ((1, 100), (2, 301), (3, 7)):
        mask[row, :pad] = 0
    result["logits_left_padded"] = logits_gap(ms, ids, mask)
    result["grad_step"] = grad_gap(ms, ids[:, :256])
    prompts = torch.randint(0, CONFIG["vocab_size"], (8, 200), generator=g, device="cuda")
    result["greedy_random_weights"] = greedy(ms, prompts, 32)
    print(json.dumps(result), flush=True)

    rates = {}
    for impl in ("fa2gen", "sdpa"):
        rates[impl] = {
            "train_tokens_per_s": round(train_rate(ms[impl], 8, 1024)),
            "generate_tokens_per_s": round(generate_rate(ms[impl], 8, 512, 128)),
        }
    result["rates"] = rates  # (training moved the weights apart: the rest reloads them)
    print(json.dumps(rates), flush=True)

    half, alphabet = 48, 512
    ms = models()
    losses = train_copy(ms["sdpa"], args.train_steps, half, alphabet)
    state = ms["sdpa"].state_dict()
    for impl in ("fa2gen", "eager"):
        ms[impl].load_state_dict(state)
    g = torch.Generator(device="cuda").manual_seed(4)
    prompts = copy_batch(g, 8, half, alphabet)[:, : half + 4]  # the noise, and the copy's first 4 tokens
    result["copy_task"] = {
        "steps": args.train_steps,
        "loss_first": round(losses[0], 4),
        "loss_last10": round(sum(losses[-10:]) / 10, 4),
    }
    result["greedy_trained"] = greedy(ms, prompts, half - 4)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    print(f"{result['device']}: fa2gen against sdpa (eager against sdpa)")
    for key in ("logits_unpadded", "logits_left_padded", "grad_step"):
        print(f"{key:22s} {result[key]['fa2gen']:.5f} ({result[key]['eager']:.5f})")
    for key in ("greedy_random_weights", "greedy_trained"):
        r, e = result[key]["fa2gen"], result[key]["eager"]
        print(
            f"{key:22s} tokens {r['tokens_agreeing']}/{r['tokens']} sequences {r['sequences_identical']}/"
            f"{r['sequences']} ({e['tokens_agreeing']}/{e['tokens']}, {e['sequences_identical']}/{e['sequences']})"
        )
    for impl, r in rates.items():
        print(f"{impl:8s} train {r['train_tokens_per_s']:>9} tok/s  generate {r['generate_tokens_per_s']:>7} tok/s")


if __name__ == "__main__":
    main()
