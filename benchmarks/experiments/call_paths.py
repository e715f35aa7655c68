"""Probe: why the bench and the tuner time the same forward kernel apart. On a few canonical
cells (B*N = 16k, H = 2048 / D), fa2gen's shipped kernel is timed four ways in one process:
as the tuner does (``forward`` on a kept ``Launch``, output preallocated), as the bench does
(``fa2gen.attention``), the same call after the bench's ``warm_gpu`` (100 ms of fp16 matmuls
right before the timing), and the call replayed from a CUDA graph; SDPA cuDNN without and
with the warm-up beside it. Every timing is do_bench's median with L2 flushed. Two rounds.
With ``--heat S``: on two cells, the call and cuDNN timed directly and through the bench's own
``run_case``, then S seconds of fp16 matmuls, then both again, with the GPU's clock and
temperature (pynvml, where torch finds it) before each: whether a GPU that has run for
minutes, as in a bench, times the two apart differently from a fresh one.

usage (GPU machine): python benchmarks/experiments/call_paths.py [--out call-paths.json] [--heat S]
"""

from __future__ import annotations

import argparse
import json

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import fa2gen
from fa2gen.bench.grid import Case, make_inputs
from fa2gen.bench.runner import run_case
from fa2gen.bench.timing import graph_replay, measure, warm_gpu
from fa2gen.runtime.device import cuda_device_info
from fa2gen.runtime.dispatch import select_params
from fa2gen.runtime.launch import Launch, forward
from fa2gen.runtime.problem import make_problem

CELLS = [("bf16", 64, 1024, True), ("fp16", 64, 1024, True), ("bf16", 64, 512, True),
         ("bf16", 128, 1024, True), ("bf16", 128, 4096, False)]


def _gpu_state() -> dict:
    try:
        return {"clock_mhz": torch.cuda.clock_rate(), "temp_c": torch.cuda.temperature()}
    except Exception as e:  # no pynvml: the timings alone
        return {"unavailable": f"{type(e).__name__}"}


def heat(seconds: float, out: str | None) -> None:
    import time

    rows = []
    cells = [Case(16, 32, 1024, 64, True, "bf16"), Case(4, 16, 4096, 128, False, "bf16")]
    for phase in ("fresh", "heated"):
        if phase == "heated":
            a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                for _ in range(20):
                    a @ a
                torch.cuda.synchronize()
        for case in cells:
            q, k, v = make_inputs(case, torch.device("cuda"))

            def call():
                return fa2gen.attention(q, k, v, causal=case.causal)

            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=case.causal)

            call(), cudnn()
            torch.cuda.synchronize()
            row = {"phase": phase, "case": case.label(), "gpu": _gpu_state(), "us": {}}
            row["us"]["call"] = measure(call).median_ms * 1e3
            row["us"]["cudnn"] = measure(cudnn).median_ms * 1e3
            r = run_case(case, ["fa2gen", "sdpa-cudnn"], torch.device("cuda"))
            row["us"]["bench_call"] = r.ms["fa2gen"][1] * 1e3
            row["us"]["bench_cudnn"] = r.ms["sdpa-cudnn"][1] * 1e3
            row["gpu_after"] = _gpu_state()
            rows.append(row)
            if out:
                with open(out, "w") as f:
                    json.dump(rows, f, indent=1)
            u = row["us"]
            print(f"{phase:6s} {case.label():38s} {row['gpu']} " + " ".join(f"{k} {t:7.1f}" for k, t in u.items())
                  + f" | x cuDNN: direct {u['cudnn'] / u['call']:.3f} bench {u['bench_cudnn'] / u['bench_call']:.3f}",
                  flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--heat", type=float, default=0.0)
    args = ap.parse_args()
    if args.heat:
        return heat(args.heat, args.out)
    rows = []
    info = cuda_device_info(0)
    for rnd in range(args.rounds):
        for dtype, d, n, causal in CELLS:
            case = Case(16384 // n, 2048 // d, n, d, causal, dtype)
            q, k, v = make_inputs(case, torch.device("cuda"))
            problem = make_problem(q, k, v, causal=causal)
            params = select_params(problem, info)
            kept = Launch(problem, params, info.sm_count)
            out = torch.empty_like(q)

            def tuner_way():
                return forward(q, k, v, problem, params, out=out, launch=kept)

            def call():
                return fa2gen.attention(q, k, v, causal=causal)

            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

            for fn in (tuner_way, call, cudnn):
                fn()
            torch.cuda.synchronize()
            us = {}
            us["kept"] = measure(tuner_way).median_ms * 1e3
            us["call"] = measure(call).median_ms * 1e3
            us["graph"] = measure(graph_replay(call)).median_ms * 1e3
            us["cudnn"] = measure(cudnn).median_ms * 1e3
            warm_gpu()
            us["call_warmed"] = measure(call).median_ms * 1e3
            warm_gpu()
            us["cudnn_warmed"] = measure(cudnn).median_ms * 1e3
            row = {"round": rnd, "case": case.label(), "params": params.label(), "us": us}
            rows.append(row)
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(rows, f, indent=1)
            print(f"{rnd} {case.label():38s} " + " ".join(f"{k} {t:7.1f}" for k, t in us.items())
                  + f" | x cuDNN: kept {us['cudnn'] / us['kept']:.3f} call {us['cudnn'] / us['call']:.3f}"
                  + f" warmed {us['cudnn_warmed'] / us['call_warmed']:.3f}", flush=True)


if __name__ == "__main__":
    main()
