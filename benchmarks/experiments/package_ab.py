"""A/B of the forward kernel between versions of fa2gen, each launched with the same params.

A template change alters the template hash, so a branch's dispatch skips the shipped configs
and falls back to defaults; comparing ``fa2gen bench`` runs would then compare different tiles.
Here the params come from one version's dispatch (``params``), and every version's kernel runs
with exactly those (``time``), each cell next to SDPA cuDNN in the same process so that drift
between runs cancels in the ratio. fp8 cells are anchored to cuDNN on the same values in bf16.
Every kernel's output is checked against cuDNN's (max abs difference, in the records).

usage (GPU machine; each version a copy of its package and shipped configs):
  git archive BRANCH fa2gen tuned_configs | tar -x -C pkgs/BRANCH
  PYTHONPATH=pkgs/main python benchmarks/experiments/package_ab.py params params.json [CELLS]
  python benchmarks/experiments/package_ab.py force params.json 128,128,8,2,tma_host,separate,0,2 [CELLS]
  python benchmarks/experiments/package_ab.py time pkgs/BRANCH BRANCH params.json records.jsonl [CELLS]
  python benchmarks/experiments/package_ab.py report records.jsonl [BASE]

CELLS, a regular expression over the cell keys ("fp16 D128 N512 causal"), picks some cells.
The results of perf-notes v33-v35 are in benchmarks/results/fwd-ab-v33-v35/.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import sys
import time


def _cells(only: str = ""):
    """The cells, or those whose key matches the regular expression ``only``."""
    import re

    from fa2gen.bench.grid import canonical_grid

    cells = canonical_grid() + canonical_grid(dtypes=("fp8e4m3",), head_dims=(128,), seqlens=(1024, 4096, 16384))
    return [c for c in cells if re.search(only, _key(c))]


def _key(case) -> str:
    return f"{case.dtype} D{case.head_dim} N{case.seqlen} {'causal' if case.causal else 'full'}"


def params(path: str, only: str = "") -> None:
    import torch

    from fa2gen.bench.grid import make_inputs
    from fa2gen.runtime.device import cuda_device_info
    from fa2gen.runtime.dispatch import select_params
    from fa2gen.runtime.problem import make_problem

    info = cuda_device_info(0)
    chosen = {}
    for case in _cells(only):
        q, k, v = make_inputs(case, torch.device("cuda"))
        chosen[_key(case)] = dataclasses.asdict(select_params(make_problem(q, k, v, causal=case.causal), info))
    with open(path, "w") as f:
        json.dump(chosen, f, indent=1)


def force(path: str, fields: str, only: str = "") -> None:
    """A params file that runs every cell (or those matching ``only``) on one point, given as
    block_m,block_n,num_warps,num_stages,loads[,dq_mode[,persistent[,gluon]]]: a template
    change A/B'd on the form it changes, whatever the shipped configs dispatch."""
    from fa2gen.generator.spec import TuningParams

    p = TuningParams(*(int(f) if f.isdigit() else f for f in fields.split(",")))
    with open(path, "w") as f:
        json.dump({_key(case): dataclasses.asdict(p) for case in _cells(only)}, f, indent=1)


def timed(package: str, tag: str, params_path: str, records: str, only: str = "") -> None:
    sys.path.insert(0, os.path.abspath(package))  # this version's fa2gen, ahead of any installed one
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    import fa2gen
    from fa2gen.bench.grid import make_inputs
    from fa2gen.bench.timing import measure
    from fa2gen.generator.spec import TuningParams
    from fa2gen.runtime.device import cuda_device_info
    from fa2gen.runtime.launch import Launch, forward
    from fa2gen.runtime.problem import make_problem

    if not fa2gen.__file__.startswith(os.path.abspath(package)):
        raise RuntimeError(f"imported {fa2gen.__file__}, not the package under {package}")
    with open(params_path) as f:
        chosen = json.load(f)
    sm_count = cuda_device_info(0).sm_count
    cases = [c for c in _cells(only) if _key(c) in chosen]  # the cells the params file has
    if not cases:
        raise SystemExit(f"package_ab: no cell of {params_path} matches {only!r}")
    with open(records, "a") as out:
        for case in cases:
            q, k, v = make_inputs(case, torch.device("cuda"))
            problem = make_problem(q, k, v, causal=case.causal)
            p = TuningParams(**chosen[_key(case)])
            launch = Launch(problem, p, sm_count)
            start = time.time()
            o, _ = forward(q, k, v, problem, p, launch=launch)
            torch.cuda.synchronize()
            compile_s = time.time() - start
            ref_in = [t.to(torch.bfloat16) for t in (q, k, v)] if case.dtype == "fp8e4m3" else (q, k, v)
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                ref = sdpa(*ref_in, is_causal=case.causal)
                cudnn_ms = measure(lambda: sdpa(*ref_in, is_causal=case.causal)).median_ms
            ms = measure(lambda: forward(q, k, v, problem, p, launch=launch)).median_ms
            rec = dict(tag=tag, cell=_key(case), label=p.label(), ms=ms, cudnn_ms=cudnn_ms,
                       err=(o.float() - ref.float()).abs().max().item(), compile_s=compile_s)
            out.write(json.dumps(rec) + "\n")
            out.flush()
            print(f"{tag:16s} {_key(case):28s} {ms:8.4f} ms  x cuDNN time {ms / cudnn_ms:6.3f}", flush=True)


def report(records: str, base: str = "main") -> None:
    """Per cell and version: the median over runs of (time / cuDNN's), over the base's; and of
    the raw times, which cuDNN's own spread between passes does not move."""
    runs = collections.defaultdict(list)
    raw = collections.defaultdict(list)
    labels, tags = {}, []
    with open(records) as f:
        for line in f:
            r = json.loads(line)
            runs[(r["tag"], r["cell"])].append(r["ms"] / r["cudnn_ms"])
            raw[(r["tag"], r["cell"])].append(r["ms"])
            if r["tag"] == base or r["cell"] not in labels:  # the params column is the base's
                labels[r["cell"]] = r["label"]
            if r["tag"] not in tags:
                tags.append(r["tag"])
    others = [t for t in tags if t != base]

    def median(xs):
        xs = sorted(xs)
        return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2

    def rel(tag, cell, times=runs):
        # None where a version has no run of the cell (a pass cut short)
        if not times[(tag, cell)] or not times[(base, cell)]:
            return None
        return median(times[(tag, cell)]) / median(times[(base, cell)])

    def shown(tag, cell):
        return "      -  /    - " if rel(tag, cell) is None else f"{rel(tag, cell):7.3f} /{rel(tag, cell, raw):6.3f}"

    print(f"time over {base}'s (below 1: faster), median of runs: cuDNN-normalised / raw")
    print(f"{'cell':28s} {base + ' params':48s} " + " ".join(f"{t[:15]:>15s}" for t in others))
    for cell in labels:
        print(f"{cell:28s} {labels[cell][:48]:48s} " + " ".join(shown(t, cell) for t in others))
    groups = {
        "Gluon persistent": lambda c: "persistent" in labels[c] and "gluon" in labels[c],
        "Gluon, causal": lambda c: "gluon" in labels[c] and c.endswith("causal"),
        "Gluon, full": lambda c: "gluon" in labels[c] and c.endswith("full"),
        "Triton template (control)": lambda c: "gluon" not in labels[c],
    }
    for name, member in groups.items():
        for fp8 in (False, True):
            cells = [c for c in labels if member(c) and c.startswith("fp8") == fp8]
            for t in others:
                ratios = [rel(t, c) for c in cells if rel(t, c) is not None]
                if ratios:
                    gm = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
                    print(f"geomean {name}{', fp8' if fp8 else ''}, {t} ({len(ratios)} of {len(cells)} cells): {gm:.3f}")


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    {"params": params, "force": force, "time": timed, "report": report}[command](*args)
