"""Host time per attention call, where the GPU waits on the host: fa2gen against SDPA's FLASH
and cuDNN backends on a tiny problem, with and without a gradient, in one run.

A call this small (default 1 x 8 x 128 x 64, causal, bf16) runs for a few microseconds on the
GPU, so back-to-back calls measure what the host spends on each: validation, dispatch, the
launch. Each provider makes N calls in a row and the time per call is taken over them (the
GPU synchronised before and after); the providers take turns for R rounds, the order reversed
every other round, and each reports its best round. "grad" calls the forward with q, k and v
requiring grad, so that autograd records the call.

Beside them: fa2gen's launch alone (``forward()``) with host descriptors and with pointer loads,
the two forms the defaults choose between for such calls (``runtime.defaults.host_bound``),
each also replayed in a CUDA graph (the GPU time alone), and ``torch.add`` on q as the floor of
one PyTorch op.

usage: python benchmarks/host_cost.py --out host.json [--shape 1,8,128,64] [--calls 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

import fa2gen
from fa2gen.runtime.device import cuda_device_info
from fa2gen.runtime.dispatch import select_params
from fa2gen.runtime.launch import Launch, forward
from fa2gen.runtime.problem import make_problem


def per_call_us(fn, calls: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def graph_us(fn, replays: int = 200) -> float:
    """GPU time of one ``fn`` call: a CUDA graph of it replayed back to back."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return per_call_us(g.replay, replays)


def providers(q, k, v, causal: bool) -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def sdpa(backend):
        def run():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        return run

    return {
        "fa2gen": lambda: fa2gen.attention(q, k, v, causal=causal),
        "sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION),
        "sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
        "torch.add": lambda: torch.add(q, q),
    }


def rounds_of(calls: dict, n: int, rounds: int) -> dict:
    best = {name: float("inf") for name in calls}
    order = list(calls)
    for name in order:  # compile, build and warm every provider first
        for _ in range(20):
            calls[name]()
    for r in range(rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            best[name] = min(best[name], per_call_us(calls[name], n))
    return {name: round(us, 1) for name, us in best.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="1,8,128,64", help="B,H,N,D")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    b, h, n, d = map(int, args.shape.split(","))
    causal = True
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    table = {"no grad": rounds_of(providers(q, k, v, causal), args.calls, args.rounds)}
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    table["grad"] = rounds_of(providers(qg, kg, vg, causal), args.calls, args.rounds)

    problem = make_problem(q, k, v, causal=causal)
    default = select_params(problem, cuda_device_info(torch.cuda.current_device()))
    forms = {}
    for loads in ("tma_host", "pointer"):
        params = default.replace(loads=loads)
        launch = Launch(problem, params)

        def run(params=params, launch=launch):
            return forward(q, k, v, problem, params, launch=launch)

        forms[loads] = {"host_us": rounds_of({loads: run}, args.calls, args.rounds)[loads], "gpu_us": None}
        forms[loads]["gpu_us"] = round(graph_us(run), 2)
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "shape": f"{b} x {h} x {n} x {d}, causal, bf16",
        "calls": args.calls,
        "rounds": args.rounds,
        "default": default.label(),
        "us_per_call": table,
        "forward_forms": forms,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"us per call, {result['shape']}, {result['device']}; fa2gen's default: {result['default']}")
    print(f"{'':12s}" + "".join(f"{name:>12s}" for name in table["no grad"]))
    for mode, row in table.items():
        print(f"{mode:12s}" + "".join(f"{us:12.1f}" for us in row.values()))
    for loads, r in forms.items():
        print(f"forward() {loads:9s} host {r['host_us']:6.1f} us  GPU {r['gpu_us']:6.2f} us")


if __name__ == "__main__":
    main()
