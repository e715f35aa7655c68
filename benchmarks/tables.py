"""Write docs/benchmarks.md from the committed benchmark JSON files.

Usage: python benchmarks/tables.py > docs/benchmarks.md          (the committed sources below)
       python benchmarks/tables.py BENCH.json ... [--memory M.json] [--train T.json]
A bench file's sidecar ``NAME.note.md``, where present, is printed under its table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fa2gen.bench.report import markdown, read_json
from fa2gen.bench.runner import geomean

ANCHORS = Path(__file__).parent / "anchors" / "h200-fwd-fp16.json"


# what a run recorded without a "timing" field did (fa2gen.bench.timing before the rounds)
ONE_WINDOW = "one do_bench window per provider, after 100 ms of matmuls"


def anchor_section(results, provider: str) -> str:
    """``provider`` against the Triton tutorial's reference figures, raw and cuDNN-bridged."""
    anchors = json.loads(ANCHORS.read_text())
    lines = [
        f"| cell | {provider} | tutorial | {provider} / tutorial | cuDNN here / cuDNN there |",
        "|---|---|---|---|---|",
    ]
    raw, bridged = [], []
    for r in results:
        cell = anchors["cells"].get(f"{r.case.head_dim}-{'causal' if r.case.causal else 'full'}")
        if (
            r.case.dtype != "fp16"
            or cell is None
            or r.case.seqlen not in anchors["seqlens"]
            or provider not in r.tflops
        ):
            continue
        i = anchors["seqlens"].index(r.case.seqlen)
        mine, tut = r.tflops[provider], cell["triton-tutorial"][i]
        drift = r.tflops["sdpa-cudnn"] / cell["sdpa-cudnn"][i]
        raw.append(mine / tut)
        bridged.append(mine / (tut * drift))
        lines.append(f"| {r.case.label()} | {mine:.0f} | {tut} | {mine / tut:.2f} | {drift:.2f} |")
    if not raw:
        return ""
    lines.append("")
    lines.append(
        f"Geomean {provider} / tutorial figures: **{geomean(raw):.3f}**; with each tutorial figure scaled by "
        f"how fast cuDNN ran here relative to the reference run: **{geomean(bridged):.3f}**."
    )
    return "\n".join(lines)


SHIPPED = Path(__file__).parent.parent / "tuned_configs" / "sm90"
RESULTS = "benchmarks/results"
# What docs/benchmarks.md is built from, in its order (paths from the repository root).
SOURCES = [
    f"{RESULTS}/{name}.json"
    for name in (
        "bench-fwd-fp16",
        "bench-fwd-bf16",
        "bench-fwd-fp8",
        "rounds-own-warm/bench-fwd-fp8e4m3-d128",
        "bench-bwd-fp16",
        "bench-bwd-bf16",
        "bench-fwdbwd-fp16",
        "bench-fwdbwd-bf16",
        "triton-versions-h100/fwd-triton-3.6.0",
        "triton-versions-h100/fwd-triton-3.9.0",
        "triton-versions-h100/bwd-triton-3.6.0",
        "triton-versions-h100/bwd-triton-3.9.0",
        "triton-versions-h100/fwd-triton-3.6.0-h100-tuned",
        "triton-versions-h100/fwd-triton-3.9.0-h100-tuned",
        "triton-versions-h100/bwd-triton-3.6.0-h100-tuned",
        "triton-versions-h100/bwd-triton-3.9.0-h100-tuned",
    )
]
MEMORY = f"{RESULTS}/memory-h200.json"
# benchmarks/decode.py and benchmarks/varlen.py runs, newest first
DECODE = [
    f"{RESULTS}/decode-h100-q16.json",
    f"{RESULTS}/decode-h100-tuned.json",
    f"{RESULTS}/decode-h200.json",
    f"{RESULTS}/decode-h100-n128.json",
    f"{RESULTS}/decode-h100-n64.json",
]
VARLEN = [f"{RESULTS}/varlen-h100.json"]
HOST = [f"{RESULTS}/host-h100.json"]  # benchmarks/host_cost.py
HF = [f"{RESULTS}/hf-llama-h100.json"]  # benchmarks/hf_llama.py
TRAIN = f"{RESULTS}/train-gpt-h200.json"


def tuned_section(path: Path) -> str:
    """What the shipped tuned configs gained over the defaults, as the tuner measured it
    (each bucket's best config and its default timed in the same study)."""
    from fa2gen.store.yamlfile import read

    cfg = read(path)
    fwd = [e for e in cfg.entries if e.bucket.direction == "fwd" and not e.bucket.varlen]
    square = [e for e in fwd if e.bucket.seqlen_q == e.bucket.seqlen_k and e.bucket.dtype != "fp8e4m3"]
    fp8 = [e for e in fwd if e.bucket.dtype == "fp8e4m3"]  # all of them, square or not
    short = [e for e in fwd if e.bucket.seqlen_q != e.bucket.seqlen_k and e.bucket.dtype != "fp8e4m3"]
    bwd = [e for e in cfg.entries if e.bucket.direction == "bwd" and not e.bucket.varlen]
    packed = [e for e in cfg.entries if e.bucket.varlen]
    decode = [e for e in cfg.entries if e.bucket.direction == "decode"]
    lines = [
        f"`{path.relative_to(Path.cwd())}`: {len(cfg.entries)} buckets, device {cfg.meta['device']}, "
        f"triton {cfg.meta['triton']}, torch {cfg.meta['torch']}, {cfg.meta['date'][:10]}. "
        "Speedup = the default config's median time over the tuned config's, both measured in the bucket's study "
        "(representative problem, do_bench median, L2 flushed), against the default of the day the bucket was "
        "tuned.\n"
    ]
    stale = [e for e in cfg.entries if not e.current]
    if stale:
        lines.append(
            f"- {len(stale)} entries were measured on code their params no longer render to: the run-time "
            "lookup skips them until their buckets are tuned again."
        )
    for name, group in (
        ("forward fp16/bf16, canonical square buckets (N = 512 ... 16k)", square),
        ("forward fp8 (e4m3) buckets", fp8),
        ("forward, short-query buckets (Nq = 1 ... 256, Nk = 8192)", short),
        ("backward, canonical square buckets (N = 512 ... 16k)", bwd),
        ("packed batches (attention_varlen), forward and backward", packed),
        ("decoding over a KV cache (attention_with_kvcache)", decode),
    ):
        ups = [e.speedup for e in group if e.speedup]
        if ups:
            lines.append(
                f"- {name}: {len(group)} buckets, geomean speedup over the default **{geomean(ups):.3f}**, "
                f"{sum(u > 1.02 for u in ups)} above 1.02, best {max(ups):.2f}"
            )

    def key(e):
        b = e.bucket
        return b.direction, b.varlen, b.dtype, b.head_dim, b.mask, b.seqlen_q, b.seqlen_k, b.batch_heads, b.page

    lines += ["", "| bucket | tuned config | TFLOP/s | us | vs default |", "|---|---|---|---|---|"]
    for e in sorted(short + bwd + packed + decode, key=key):
        m = e.measurement
        lines.append(
            f"| {e.bucket.key} | {e.params.label()} | {m.tflops:.0f} | {m.median_ms * 1e3:.1f} | {e.speedup:.2f} |"
        )
    return "\n".join(lines)


MODE_TITLES = {"fwd": "Forward", "bwd": "Backward (the backward pass alone)", "fwd+bwd": "Forward + backward"}


def _comparisons(results, providers) -> list[str]:
    lines = []
    for mine in ("fa2gen", "fa2gen-default"):
        for other in providers:
            both = [r for r in results if mine in r.tflops and other in r.tflops and other != mine]
            if both:
                ratios = [r.tflops[mine] / r.tflops[other] for r in both]
                wins = sum(x >= 1 for x in ratios)
                lines.append(
                    f"- {mine} / {other}: geomean {geomean(ratios):.3f}, at or above on {wins} of {len(both)} "
                    f"cells, lowest {min(ratios):.2f}"
                )
    return lines


def bench_section(path: str) -> None:
    env, providers, results = read_json(path)
    dtypes = sorted({r.case.dtype for r in results})
    modes = sorted({r.mode for r in results})
    title = " / ".join(MODE_TITLES.get(m, m) for m in modes)
    print(f"## {title}: {', '.join(dtypes)} on {env['device']} ({env['date'][:10]})\n")
    timing = env.get("timing", ONE_WINDOW)
    print(
        f"torch {env['torch']}, triton {env['triton']}, fa2gen {env['fa2gen']}. Timing: {timing}. Source: `{path}`.\n"
    )
    print(markdown(results, providers))
    print()
    print("\n".join(_comparisons(results, providers)))
    note = Path(path).with_suffix(".note.md")
    if note.exists():
        print("\n" + note.read_text().strip())
    png = Path(path).with_suffix(".png")
    if png.exists():
        print(f"\n![TFLOP/s against sequence length](../{png})")
    print()
    for provider in ("fa2gen-default", "fa2gen"):
        section = anchor_section(results, provider) if modes == ["fwd"] else ""
        if section:
            print(
                f"### {provider} against the Triton tutorial's reference figures "
                f"(`{ANCHORS.relative_to(Path.cwd())}`)\n"
            )
            print(json.loads(ANCHORS.read_text())["about"] + "\n")
            print(section)
            print()


def memory_section(path: str) -> None:
    data = json.loads(Path(path).read_text())
    print(f"## Peak memory of forward + backward ({data['device']}, {data['shape']})\n")
    print(
        "`torch.cuda.max_memory_allocated` above the inputs during one forward and backward pass "
        f"(`benchmarks/memory.py`; source `{path}`). SDPA's math backend materialises the N x N scores.\n"
    )
    print("| N | fa2gen MiB | fa2gen KiB per token | SDPA math MiB |")
    print("|---|---|---|---|")
    for row in data["rows"]:
        math = row["sdpa-math"]
        math = f"{math / 2**20:.0f}" if isinstance(math, int) else math
        print(
            f"| {row['seqlen']} | {row['fa2gen'] / 2**20:.1f} | {row['fa2gen'] / row['seqlen'] / 1024:.2f} | {math} |"
        )
    per_token = [row["fa2gen"] / row["seqlen"] for row in data["rows"]]
    print(
        f"\nfa2gen's peak per token varies by a factor of {max(per_token) / min(per_token):.3f} from N = "
        f"{data['rows'][0]['seqlen']} to {data['rows'][-1]['seqlen']}: linear in N.\n"
    )


def _note(path: str) -> None:
    note = Path(path).with_suffix(".note.md")
    if note.exists():
        print(note.read_text().strip() + "\n")


def decode_section(path: str) -> None:
    """GB/s of K and V read per provider, with fa2gen over the best SDPA backend and over the copy."""
    data = json.loads(Path(path).read_text())
    rows = data["rows"]
    names = list(rows[0]["providers"])
    page = rows[0]["page_size"]
    graphs = ", CUDA graph replays" if data.get("timing") == "CUDA graph replays" else ""
    print(f"## Decoding over a KV cache: {data['device']} ({data['shape']}{graphs})\n")
    print(
        f"torch {data['torch']}, triton {data['triton']}; `benchmarks/decode.py`, source `{path}`. GB/s of K and V "
        "read (2·B·N·Hkv·D·2 bytes over the median time); `copy` is a device-to-device copy of as many bytes "
        f"(at most 2 GiB), read + write bytes over its time, in the same cell. `paged`: the same cache in pages of "
        f"{page} keys, shuffled. `/SDPA` is fa2gen (contiguous) over the fastest SDPA backend of the cell; "
        "`/copy` over the copy. `-`: the backend refused the cell.\n"
    )
    _note(path)
    print("| Sq | B | keys | " + " | ".join(names) + " | /SDPA | paged/contiguous | /copy |")
    print("|" + "---|" * (len(names) + 6))
    ratios, pages, copies = [], [], []
    for r in rows:
        gb = {n: r["providers"][n].get("gbps") for n in names}
        sdpa = max((gb[n] for n in names if n.startswith("sdpa") and gb[n]), default=None)
        ours, paged = gb["fa2gen-contiguous"], gb["fa2gen-paged"]
        cells = " | ".join(f"{gb[n]:.0f}" if gb[n] else "-" for n in names)
        ratio = ours / sdpa if sdpa else None
        if ratio:
            ratios.append(ratio)
        pages.append(paged / ours)
        big = r["keys"] >= 8192 and r["batch"] >= 8
        if big:
            copies.append(ours / gb["copy"])
        print(
            f"| {r['sq']} | {r['batch']} | {r['keys']} | {cells} | {f'{ratio:.2f}' if ratio else '-'} | "
            f"{paged / ours:.2f} | {ours / gb['copy']:.2f} |"
        )
    print(
        f"\nfa2gen / best SDPA: geomean {geomean(ratios):.3f}, at or above on {sum(x >= 1 for x in ratios)} of "
        f"{len(ratios)} cells, lowest {min(ratios):.2f}. Paged / contiguous: geomean {geomean(pages):.3f}, "
        f"within 5% on {sum(x >= 0.95 for x in pages)} of {len(pages)}. From 8k keys and batch 8: fa2gen / copy "
        f"lowest {min(copies):.2f}, at or above 0.85 on {sum(x >= 0.85 for x in copies)} of {len(copies)}.\n"
    )


def varlen_section(path: str) -> None:
    """A packed batch's TFLOP/s per provider, forward and backward, and varlen over dense."""
    data = json.loads(Path(path).read_text())
    rows = data["rows"]
    names = list(rows[0]["providers"])
    print(f"## Packed batches (varlen): {data['device']}\n")
    print(
        f"torch {data['torch']}, triton {data['triton']}; `benchmarks/varlen.py`, source `{path}`. One batch of "
        f"sequences of lengths {data['lengths']} ({sum(data['lengths'])} tokens), hidden 2048 (H = 2048 / D). "
        "TFLOP/s of useful work (4·H·N_b²·D per sequence, halved when causal; the backward 2.5x, timed as forward + "
        "backward less the forward). `fa2gen-dense`: `fa2gen.attention` once per sequence; `-padded`/`-masked`: "
        "the batch padded to its longest sequence; `flex-document`: FlexAttention with a document mask over the "
        "packed tokens.\n"
    )
    _note(path)
    print("| dtype | D | causal | pass | " + " | ".join(names) + " | varlen / dense |")
    print("|" + "---|" * (len(names) + 5))
    for r in rows:
        p = r["providers"]
        for d in ("fwd", "bwd"):
            cells = " | ".join(f"{p[n][d + '_tflops']:.0f}" if "error" not in p[n] else "-" for n in names)
            ratio = p["fa2gen-varlen"][d + "_tflops"] / p["fa2gen-dense"][d + "_tflops"]
            print(f"| {r['dtype']} | {r['head_dim']} | {r['causal']} | {d} | {cells} | {ratio:.2f} |")
    print()


def train_section(path: str) -> None:
    data = json.loads(Path(path).read_text())
    cfg, runs = data["config"], {r["name"]: r for r in data["runs"]}
    print(f"## Training check ({data['device']})\n")
    print(
        f"`benchmarks/train_gpt.py` (source `{path}`): a GPT-style model, {cfg['layers']} layers, width {cfg['dim']}, "
        f"{cfg['heads']} heads, sequence {cfg['seq']}, batch {cfg['batch']}, vocabulary {cfg['vocab']}, bf16 autocast, "
        f"AdamW lr {cfg['lr']}, random init, synthetic tokens from a fixed sparse Markov chain; {cfg['steps']} steps "
        "with fa2gen's causal attention and with SDPA's, same seed and batches.\n"
    )
    a, b = runs["fa2gen"]["losses"], runs["sdpa"]["losses"]
    print("| step | fa2gen loss | SDPA loss |")
    print("|---|---|---|")
    for i in list(range(0, len(a), max(1, len(a) // 10))) + [len(a) - 1]:
        print(f"| {i} | {a[i]:.4f} | {b[i]:.4f} |")
    final = data["final_loss_mean_last_10pct"]
    print(
        f"\nLargest gap between the curves: {data['max_abs_loss_gap']:.4f} (initial loss {data['initial_loss']:.3f}, "
        f"uniform {data['uniform_loss']:.3f}); final loss (mean of the last 10%): fa2gen {final['fa2gen']:.4f}, "
        f"SDPA {final['sdpa']:.4f}. Throughput after {cfg['warmup']} warm-up steps: fa2gen "
        f"{runs['fa2gen']['tokens_per_s']:,.0f} tokens/s, SDPA {runs['sdpa']['tokens_per_s']:,.0f} "
        f"({runs['fa2gen']['tokens_per_s'] / runs['sdpa']['tokens_per_s']:.2f}x).\n"
    )


def host_section(path: str) -> None:
    """Host time per call (``benchmarks/host_cost.py``)."""
    data = json.loads(Path(path).read_text())
    print(f"## Host time per call: {data['device']}\n")
    print(
        f"torch {data['torch']}, triton {data['triton']}; `benchmarks/host_cost.py`, source `{path}`. "
        f"{data['shape']}: microseconds per call over {data['calls']} calls in a row, the best of "
        f"{data['rounds']} rounds taken in turns; grad: q, k and v require grad (the forward call, as "
        f"autograd records it). fa2gen's default here: {data['default']}.\n"
    )
    table = data["us_per_call"]
    names = list(table["no grad"])
    print("| | " + " | ".join(names) + " | fa2gen / cuDNN |")
    print("|---" * (len(names) + 2) + "|")
    for mode, row in table.items():
        cells = " | ".join(f"{row[n]:.1f}" for n in names)
        print(f"| {mode} | {cells} | {row['fa2gen'] / row['sdpa-cudnn']:.2f}x |")
    forms = data["forward_forms"]
    print("\nfa2gen's launch alone (`forward()`), host time per call and GPU time (a CUDA graph replayed):\n")
    print("| loads | host us | GPU us |")
    print("|---|---|---|")
    for loads, r in forms.items():
        print(f"| {loads} | {r['host_us']:.1f} | {r['gpu_us']:.2f} |")
    print()


def hf_section(path: str) -> None:
    """A transformers model with attn_implementation="fa2gen" against "sdpa" (``benchmarks/hf_llama.py``)."""
    data = json.loads(Path(path).read_text())
    m = data["model"]
    print(f"## Hugging Face transformers: {data['device']}\n")
    print(
        f"torch {data['torch']}, triton {data['triton']}, transformers {data['transformers']}; "
        f"`benchmarks/hf_llama.py`, source `{path}`. Llama-style, {m['num_hidden_layers']} layers, hidden "
        f"{m['hidden_size']}, {m['num_attention_heads']} query heads over {m['num_key_value_heads']} k/v heads, "
        "bf16, random weights; each implementation holds the same weights. In brackets: eager against sdpa, "
        "the size of PyTorch's own disagreement.\n"
    )
    print("| check | fa2gen against sdpa | (eager against sdpa) |")
    print("|---|---|---|")
    for key, name in (
        ("logits_unpadded", "logits, unpadded: largest difference / largest logit"),
        ("logits_left_padded", "logits, left-padded, at real tokens"),
        ("grad_step", "one training step: largest relative gradient difference"),
    ):
        print(f"| {name} | {data[key]['fa2gen']:.5f} | ({data[key]['eager']:.5f}) |")
    for key, name in (
        ("greedy_random_weights", "greedy generate(), random weights"),
        ("greedy_trained", "greedy generate(), trained to copy"),
    ):
        r, e = data[key]["fa2gen"], data[key]["eager"]
        print(
            f"| {name}: tokens, sequences identical | {r['tokens_agreeing']}/{r['tokens']}, "
            f"{r['sequences_identical']}/{r['sequences']} | ({e['tokens_agreeing']}/{e['tokens']}, "
            f"{e['sequences_identical']}/{e['sequences']}) |"
        )
    task = data["copy_task"]
    rates = data["rates"]
    print(
        f"\nThe copy task: {task['steps']} AdamW steps under sdpa, loss {task['loss_first']} to "
        f"{task['loss_last10']} (mean of the last 10).\n"
    )
    print("| | training tokens/s | generation tokens/s |")
    print("|---|---|---|")
    for impl, r in rates.items():
        print(f"| {impl} | {r['train_tokens_per_s']:,} | {r['generate_tokens_per_s']:,} |")
    f, s_ = rates["fa2gen"], rates["sdpa"]
    print(
        f"| fa2gen / sdpa | {f['train_tokens_per_s'] / s_['train_tokens_per_s']:.2f}x | "
        f"{f['generate_tokens_per_s'] / s_['generate_tokens_per_s']:.2f}x |\n"
    )


def main(argv: list[str]) -> None:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("bench", nargs="*", help="bench JSON files (default: SOURCES, with MEMORY and TRAIN)")
    ap.add_argument("--memory")
    ap.add_argument("--train")
    args = ap.parse_args(argv)
    committed = not args.bench
    if committed:
        args.bench, args.memory, args.train = SOURCES, args.memory or MEMORY, args.train or TRAIN
    print("# Benchmarks\n")
    print(
        "Generated by `benchmarks/tables.py` from the JSON files in `benchmarks/results/` (written by "
        "`fa2gen bench --json`). TFLOP/s are medians of `triton.testing.do_bench` (warm, L2 flushed) on fresh "
        "random normal inputs; forward FLOPs = 4·B·H·N²·D, halved when causal; the backward counts 2.5x the "
        "forward's and is timed alone (gradients of a forward run outside the timing); forward + backward counts "
        "3.5x and times a forward and its gradients together. Columns `xNAME` are "
        "fa2gen's TFLOP/s over NAME's in the same run: cuDNN = SDPA CUDNN_ATTENTION, FA2 = SDPA FLASH_ATTENTION, "
        "mem-eff = SDPA EFFICIENT_ATTENTION, Flex = compiled FlexAttention, default = fa2gen with its heuristic "
        "default configs (no tuned lookup), own-bf16 = fa2gen's forward on the same values in bf16 (fp8 tables, "
        "whose FLOPs count the same way). `fa2gen` is `fa2gen.attention()` as users call it: the shipped tuned "
        "configs (`tuned_configs/`) where they apply. Grid: B·N = 16k tokens, H = 2048 / D. "
        'Notes under the tables cite the lab notebook\'s versions ("notebook vNN") and logs that main no '
        "longer holds: both are at git tag `notebook-2026-12`. Regenerate with "
        "`python benchmarks/tables.py > docs/benchmarks.md`.\n"
    )
    for path in args.bench:
        bench_section(path)
    if committed:
        for path in DECODE:
            decode_section(path)
        for path in VARLEN:
            varlen_section(path)
        for path in HOST:
            host_section(path)
        for path in HF:
            hf_section(path)
    if args.memory:
        memory_section(args.memory)
    if args.train:
        train_section(args.train)
    shipped = sorted(SHIPPED.glob("*.yaml"))
    if shipped:
        print("## Shipped tuned configs against the defaults (tuner's own measurements)\n")
        for path in shipped:
            print(tuned_section(path))
            print()


if __name__ == "__main__":
    main(sys.argv[1:])
