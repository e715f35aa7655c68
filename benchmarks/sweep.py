"""Sweep tuning params on the local GPU to choose the heuristic defaults.

Checks each variant for correctness first (flash-attention's rule, on the output or on
the three gradients), then times it on the FlashAttention-2 paper's shapes (the forward,
or the backward alone). Writes JSON (``--out``) and prints a table.
Usage: python benchmarks/sweep.py --out sweep.json [--direction bwd]
"""

from __future__ import annotations

import argparse
import json
import time
import traceback

import torch

from fa2gen.bench.correctness import check_backward, check_forward
from fa2gen.bench.grid import Case, make_inputs
from fa2gen.bench.timing import measure
from fa2gen.generator.arch import fits
from fa2gen.generator.spec import TuningParams
from fa2gen.runtime.backward import backward
from fa2gen.runtime.defaults import default_params
from fa2gen.runtime.launch import forward
from fa2gen.runtime.problem import make_problem


def bwd_candidates(head_dim: int):
    """Backward: owned rows x stepped rows, warps, stages, both load paths. Four warps are
    left out above D=64, where every such tile spills registers (results/registers-bwd-*.json)."""
    for loads in ("tma_host", "pointer"):
        for bm in (64, 128):
            for bn in (16, 32, 64):
                for w in ((4, 8) if head_dim <= 64 else (8,)):
                    for st in (2, 3):
                        yield TuningParams(block_m=bm, block_n=bn, num_warps=w, num_stages=st, loads=loads)


def candidates(head_dim: int):
    """A sweep small enough for one short GPU run (about 28 variants per spec)."""
    if head_dim > 128:
        space = [("tma_host", bm, bn, w, s) for bm in (64, 128) for bn in (32, 64) for w in (4, 8) for s in (1, 2)]
    else:
        space = [("tma_host", bm, bn, w, s) for bm in (64, 128) for bn in (64, 128) for w in (4, 8) for s in (2, 3)]
        space += [("tma_host", 128, 32, 4, s) for s in (2, 3)] + [("tma_host", 128, 64, w, 4) for w in (4, 8)]
        space += [("pointer", 128, bn, w, s) for bn in (64, 128) for w in (4, 8) for s in (2, 3)]
    for loads, bm, bn, w, s in space:
        yield TuningParams(block_m=bm, block_n=bn, num_warps=w, num_stages=s, loads=loads)


def _backward_inputs(qkv, problem):
    """The forward's outputs (default config) and a random output gradient."""
    q, k, v = qkv
    out, lse = forward(q, k, v, problem, default_params(problem.kernel_spec(), "sm90", problem.seqlen_q))
    return out, lse, torch.randn_like(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--seqlens", default="1024,4096,16384")
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--direction", default="fwd", choices=("fwd", "bwd"))
    args = ap.parse_args()
    bwd = args.direction == "bwd"
    dev = torch.device("cuda")
    rows = []
    t_start = time.time()
    for d in map(int, args.head_dims.split(",")):
        for causal in (False, True):
            cases = [Case(16384 // n, 2048 // d, n, d, causal, args.dtype) for n in map(int, args.seqlens.split(","))]
            inputs = [make_inputs(c, dev, seed=i) for i, c in enumerate(cases)]
            problems = [make_problem(*x, causal=causal) for x in inputs]
            grads = [_backward_inputs(x, pr) for x, pr in zip(inputs, problems)] if bwd else None
            for params in (bwd_candidates(d) if bwd else candidates(d)):
                spec = problems[0].kernel_spec(args.direction)
                why = fits(spec, params, "sm90")
                row = {"head_dim": d, "causal": causal, "dtype": args.dtype, "direction": args.direction,
                       "params": params.to_dict()}
                if why:
                    rows.append({**row, "status": f"pruned: {why}"})
                    continue
                try:
                    t0 = time.time()
                    # correctness on a small odd shape of the same spec, poisoned output
                    small = Case(2, 3, 333, d, causal, args.dtype, seqlen_k=333 if causal else 517)
                    sq, sk, sv = make_inputs(small, dev, seed=99)
                    sp = make_problem(sq, sk, sv, causal=causal)
                    if bwd:
                        o, lse, dout = _backward_inputs((sq, sk, sv), sp)
                        g = [torch.full_like(t, float("nan")) for t in (sq, sk, sv)]
                        backward(sq, sk, sv, o, lse, dout, sp, params, dq=g[0], dk=g[1], dv=g[2])
                        torch.cuda.synchronize()
                        verdict = check_backward(sq, sk, sv, sp, dout, *g)
                    else:
                        o = torch.full_like(sq, float("nan"))
                        lse = torch.full((2, 3, 333), float("nan"), device=dev)
                        forward(sq, sk, sv, sp, params, out=o, lse=lse)
                        torch.cuda.synchronize()
                        verdict = check_forward(sq, sk, sv, sp, o, lse)
                    compile_s = time.time() - t0
                    if not verdict.ok:
                        rows.append({**row, "status": f"wrong: {verdict}"})
                        continue
                    tf = []
                    for i, (case, (q, k, v), pr) in enumerate(zip(cases, inputs, problems)):
                        if bwd:
                            o, lse, dout = grads[i]
                            tm = measure(lambda: backward(q, k, v, o, lse, dout, pr, params))
                            tf.append(round(tm.tflops(2.5 * case.flops()), 1))
                        else:
                            tm = measure(lambda: forward(q, k, v, pr, params))
                            tf.append(round(tm.tflops(case.flops()), 1))
                    rows.append({**row, "status": "ok", "tflops": tf, "compile_s": round(compile_s, 1)})
                except Exception as e:  # compile failures (OutOfResources, ptxas) are data here
                    rows.append({**row, "status": f"error: {type(e).__name__}: {str(e)[:200]}"})
                    traceback.print_exc(limit=1)
            # SDPA cuDNN on the same shapes, for scale
            from fa2gen.bench.providers import PROVIDERS
            from fa2gen.bench.runner import MODES, timed_call

            ref = []
            for case, (q, k, v) in zip(cases, inputs):
                if bwd:
                    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
                fn = timed_call(PROVIDERS["sdpa-cudnn"].build(case, q, k, v), args.direction, (q, k, v),
                            torch.randn_like(q) if bwd else None)
                ref.append(round(measure(fn).tflops(MODES[args.direction] * case.flops()), 1))
            rows.append({"head_dim": d, "causal": causal, "dtype": args.dtype, "status": "anchor", "provider": "sdpa-cudnn", "tflops": ref})
            print(f"D={d} causal={causal} done at {time.time() - t_start:.0f}s", flush=True)
            with open(args.out, "w") as f:  # after each spec: a cut-off sweep keeps what it measured
                json.dump({"seqlens": args.seqlens, "direction": args.direction, "rows": rows,
                           "device": torch.cuda.get_device_name()}, f, indent=1)
    # short table: best five per (D, causal) by geomean
    for d in map(int, args.head_dims.split(",")):
        for causal in (False, True):
            ok = [r for r in rows if r["head_dim"] == d and r["causal"] == causal and r["status"] == "ok"]
            anchor = [r for r in rows if r["head_dim"] == d and r["causal"] == causal and r["status"] == "anchor"]
            ok.sort(key=lambda r: -sum(r["tflops"]))
            print(f"D={d} causal={causal} cudnn={anchor[0]['tflops'] if anchor else '-'} ok={len(ok)}")
            for r in ok[:6]:
                p = r["params"]
                print(f"   {p['loads']:7s} m{p['block_m']} n{p['block_n']} w{p['num_warps']} s{p['num_stages']}: {r['tflops']}")
    bad = [r for r in rows if r["status"].startswith(("wrong", "error"))]
    print(f"wrong/error: {len(bad)}")
    for r in bad[:10]:
        print("  ", r["params"], r["status"][:160])


if __name__ == "__main__":
    main()
