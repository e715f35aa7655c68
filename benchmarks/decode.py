"""Decoding over a KV cache: fa2gen.attention_with_kvcache (contiguous and paged) against
SDPA's backends, compiled FlexAttention and a copy of the same bytes, in one run.

Each cell: B sequences whose caches hold N keys each (full: every provider attends to all N),
Sq query tokens, bf16, D=128, Hq=32, Hkv=8 (GQA 4), causal (bottom-right: query token s sees
keys up to N - Sq + s). Decoding is bound by memory, so every provider is reported in GB/s of
K and V read (2 * B * N * Hkv * D * 2 bytes over its median time), next to a device-to-device
copy of as many bytes (capped at 2 GiB; read + write bytes over its time), measured in the
same cell.

- fa2gen-contiguous: the cache as (B, N, Hkv, D);
- fa2gen-paged: the same memory as pages of --page-size keys, their order shuffled in the
  block table;
- fa2gen-attention: fa2gen.attention on the cache's (B, Hkv, N, D) view (the dense kernel);
- sdpa-flash, sdpa-cudnn, sdpa-efficient: SDPA on the same views with enable_gqa and a
  bottom-right causal mask where Sq > 1 (a backend that refuses is listed as such);
- flex: compiled FlexAttention with the same mask.

With --graphs every provider is captured into a CUDA graph and its replays are timed, as a server
runs its decoding steps: the host's part of a call is left out, which in cells under about 30 us
decides as much as the GPU does (L2 is flushed before every replay all the same). A provider that
cannot be captured is listed as such.

usage: python benchmarks/decode.py --out decode.json [--batches 1,8,64] [--keys 512,...] [--graphs]
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

import fa2gen
from fa2gen.bench.timing import graph_replay, time_in_rounds, warm_window

HQ, HKV, D = 32, 8, 128
COPY_CAP = 2 << 30


def cell(batch, sq, keys, page, flex_fn, graphs=False):
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(batch, sq, HQ, D, device=dev, dtype=dt)
    kc = torch.randn(batch, keys, HKV, D, device=dev, dtype=dt)
    vc = torch.randn(batch, keys, HKV, D, device=dev, dtype=dt)
    lens = torch.full((batch,), keys, dtype=torch.int32, device=dev)
    pages = batch * keys // page
    table = torch.randperm(pages, device=dev).view(batch, keys // page).to(torch.int32)
    kp, vp = kc.view(pages, page, HKV, D), vc.view(pages, page, HKV, D)
    causal = sq > 1
    qt, kt, vt = q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2)
    calls = {
        "fa2gen-contiguous": lambda: fa2gen.attention_with_kvcache(q, kc, vc, lens, causal=causal),
        "fa2gen-paged": lambda: fa2gen.attention_with_kvcache(q, kp, vp, lens, block_table=table, causal=causal),
        "fa2gen-attention": lambda: fa2gen.attention(qt, kt, vt, causal=causal),
    }
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    mask = causal_lower_right(sq, keys) if causal else None

    def sdpa(backend):
        def run():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=True)

        return run

    for name, backend in (
        ("sdpa-flash", SDPBackend.FLASH_ATTENTION),
        ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
        ("sdpa-efficient", SDPBackend.EFFICIENT_ATTENTION),
    ):
        calls[name] = sdpa(backend)
    from torch.nn.attention.flex_attention import create_block_mask

    block_mask = None
    if causal:
        offset = keys - sq

        def bottom_right(b, h, qi, ki):
            return qi + offset >= ki

        block_mask = create_block_mask(bottom_right, B=None, H=None, Q_LEN=sq, KV_LEN=keys, device=dev)
    calls["flex"] = lambda: flex_fn(qt, kt, vt, block_mask=block_mask, enable_gqa=True)
    nbytes = min(2 * kc.numel() * kc.element_size(), COPY_CAP)
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev).random_()
    dst = torch.empty_like(src)
    calls["copy"] = lambda: dst.copy_(src)
    live, failed = {}, {}
    for name, fn in calls.items():
        try:
            fn()
            torch.cuda.synchronize()
            live[name] = fn
        except Exception as e:  # a backend that cannot run this cell
            failed[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
            continue
        if graphs:
            try:
                live[name] = graph_replay(fn)
                torch.cuda.synchronize()
            except Exception as e:  # (a failed capture leaves the stream usable for the next)
                del live[name]
                failed[name] = f"not captured in a CUDA graph: {type(e).__name__}: {str(e).splitlines()[0][:100]}"
    times = time_in_rounds(live, warm_window, rounds=2)
    configs = {}  # what fa2gen dispatched: its params and split count
    from fa2gen.runtime.defaults import decode_splits
    from fa2gen.runtime.device import cuda_device_info
    from fa2gen.runtime.dispatch import select_params
    from fa2gen.runtime.problem import make_kvcache_problem

    info = cuda_device_info(torch.cuda.current_device())
    for name, (kk, vv, tt) in (("fa2gen-contiguous", (kc, vc, None)), ("fa2gen-paged", (kp, vp, table))):
        problem = make_kvcache_problem(q, kk, vv, lens, tt, causal=causal)
        params = select_params(problem, info, "decode")
        configs[name] = f"{params.label()} splits {decode_splits(problem, params, info.sm_count)}"
    kv_bytes = 2 * kc.numel() * kc.element_size()
    row = {"batch": batch, "sq": sq, "keys": keys, "page_size": page, "configs": configs, "providers": {}}
    for name in calls:
        t = times.get(name)
        if name in failed or isinstance(t, Exception):
            row["providers"][name] = {"error": failed.get(name) or f"{type(t).__name__}: {t}"}
            continue
        moved = 2 * nbytes if name == "copy" else kv_bytes
        row["providers"][name] = {"ms": t, "gbps": moved / (t[1] * 1e-3) / 1e9}
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--keys", default="512,2048,8192,32768,131072")
    ap.add_argument("--sq", default="1,4,16")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64 * 131072, help="skip cells with more cached keys than this")
    ap.add_argument("--graphs", action="store_true", help="time CUDA graph replays of every provider")
    args = ap.parse_args()
    import torch._dynamo
    from torch.nn.attention.flex_attention import flex_attention

    torch._dynamo.config.recompile_limit = 10_000
    torch._dynamo.config.cache_size_limit = 10_000
    flex_fn = torch.compile(flex_attention, dynamic=False)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    meta["triton"] = __import__("triton").__version__
    meta["shape"] = f"bf16 D={D} Hq={HQ} Hkv={HKV}, causal where Sq > 1, caches full"
    if args.graphs:
        meta["timing"] = "CUDA graph replays"
    rows = []
    for sq in map(int, args.sq.split(",")):
        for batch in map(int, args.batches.split(",")):
            for keys in map(int, args.keys.split(",")):
                if batch * keys > args.max_tokens:
                    continue
                torch.cuda.empty_cache()  # (the last cell's tensors are gone: its caches can be large)
                row = cell(batch, sq, keys, args.page_size, flex_fn, args.graphs)
                rows.append(row)
                print(json.dumps(row), flush=True)
                with open(args.out, "w") as f:  # after every cell: a run cut short keeps its rows
                    json.dump({**meta, "rows": rows}, f, indent=1)
    names = list(rows[0]["providers"])
    short = {n: n.replace("fa2gen-", "").replace("sdpa-", "")[:10] for n in names}
    print(f"GB/s of K and V read; {torch.cuda.get_device_name()}")
    print(f"{'Sq':>3} {'B':>3} {'keys':>7} " + " ".join(f"{short[n]:>10}" for n in names) + "  best-sdpa  copy%")
    for r in rows:
        p = r["providers"]
        gb = {n: p[n].get("gbps") for n in names}
        cells = " ".join(f"{gb[n]:10.0f}" if gb[n] else f"{'-':>10}" for n in names)
        sdpa = max((gb[n] for n in names if n.startswith("sdpa") and gb[n]), default=None)
        ours = gb["fa2gen-contiguous"]
        ratio = f"{ours / sdpa:9.2f}x" if sdpa and ours else f"{'-':>10}"
        copy = f"{100 * ours / gb['copy']:5.0f}%" if ours and gb["copy"] else "-"
        print(f"{r['sq']:3d} {r['batch']:3d} {r['keys']:7d} {cells} {ratio} {copy}")


if __name__ == "__main__":
    main()
