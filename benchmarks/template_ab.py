"""A/B of two versions of the backward template at the same tuning params.

A template change alters the template hash, so the shipped backward entries go stale and a
plain bench would compare new defaults against old tuned configs. This times both templates
with the same params on every cell of the FlashAttention-2 grid (one dtype): the config that
attention() dispatches under the first template, and the arch default.

Each template runs in its own process (the rendered source, its hash and the kernel cache
follow the template), in the order A B B A, so that drift in clocks or temperature falls on
both alike. A cell's figure per template is the mean of its two runs' medians; the spread
between a template's two runs is printed as the noise floor.

usage: python benchmarks/template_ab.py --a A.jinja --b B.jinja --out ab.json [--dtype fp16]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

from fa2gen.bench.runner import geomean


def use_template(path: str) -> None:
    """Make this process render the backward from ``path`` (before anything compiles)."""
    import functools

    import jinja2

    from fa2gen.generator import rendering

    src = open(path).read()
    original = rendering.template_source

    @functools.lru_cache(maxsize=None)
    def source(direction: str) -> str:
        return src if direction == "bwd" else original(direction)

    base = rendering._environment()
    # The package's environment and options, with the backward template taken from ``path``.
    env = base.overlay(loader=jinja2.ChoiceLoader([jinja2.DictLoader({rendering.TEMPLATES["bwd"]: src}), base.loader]))
    rendering.template_source = source
    rendering._environment = lambda: env
    rendering.template_hash.cache_clear()


def plan(template: str, path: str, dtype: str) -> None:
    """Write the params to time per cell: dispatched under ``template``, and the default."""
    use_template(template)
    import torch

    from fa2gen.bench.grid import canonical_grid, make_inputs
    from fa2gen.runtime.defaults import default_params
    from fa2gen.runtime.device import cuda_device_info
    from fa2gen.runtime.dispatch import explain
    from fa2gen.runtime.problem import make_problem

    info = cuda_device_info(torch.cuda.current_device())
    cells = []
    for case in canonical_grid(dtypes=(dtype,)):
        q, k, v = make_inputs(case, torch.device("cuda"))
        problem = make_problem(q, k, v, causal=case.causal)
        chosen = explain(problem, info, "bwd")
        params = {"dispatched": chosen.params.to_dict(),
                  "default": default_params(problem.kernel_spec("bwd"), info.arch, problem.seqlen_q).to_dict()}
        cells.append({"case": case.__dict__, "source": chosen.source, "params": params})
    with open(path, "w") as f:
        json.dump(cells, f)


def worker(template: str, plan_path: str, out_path: str) -> None:
    use_template(template)
    import torch

    from fa2gen.bench.grid import Case, make_inputs
    from fa2gen.bench.timing import measure, warm_gpu
    from fa2gen.generator.rendering import template_hash
    from fa2gen.generator.spec import TuningParams
    from fa2gen.runtime.backward import backward
    from fa2gen.runtime.dispatch import select_params
    from fa2gen.runtime.device import cuda_device_info
    from fa2gen.runtime.launch import forward
    from fa2gen.runtime.problem import make_problem

    info = cuda_device_info(torch.cuda.current_device())
    rows = []
    for cell in json.load(open(plan_path)):
        case = Case(**cell["case"])
        q, k, v = make_inputs(case, torch.device("cuda"))
        problem = make_problem(q, k, v, causal=case.causal)
        out, lse = forward(q, k, v, problem, select_params(problem, info))
        dout = torch.randn_like(out)
        row = {"cell": case.label(), "tflops": {}}
        for name, p in cell["params"].items():
            params = TuningParams.from_dict(p)
            warm_gpu()
            ms = measure(lambda: backward(q, k, v, out, lse, dout, problem, params)).median_ms
            row["tflops"][name] = 2.5 * case.flops() / ms / 1e9
        rows.append(row)
    with open(out_path, "w") as f:
        json.dump({"template_hash": template_hash("bwd"), "cells": rows}, f)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="backward template A (the reference)")
    ap.add_argument("--b", required=True, help="backward template B")
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="fp16", choices=("fp16", "bf16"))
    ap.add_argument("--worker", nargs=3, metavar=("TEMPLATE", "PLAN", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--plan", nargs=2, metavar=("TEMPLATE", "OUT"), help=argparse.SUPPRESS)
    if "--worker" in sys.argv or "--plan" in sys.argv:
        args, _ = ap.parse_known_args(["--a", "-", "--b", "-", "--out", "-"] + sys.argv[1:])
        return worker(*args.worker) if args.worker else plan(*args.plan, args.dtype)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    me = [sys.executable, __file__]
    subprocess.run(me + ["--plan", args.a, f"{tmp}/plan.json", "--dtype", args.dtype], check=True)
    runs = {"A": [], "B": []}
    for i, which in enumerate("ABBA"):
        path = f"{tmp}/{which}{i}.json"
        subprocess.run(me + ["--worker", getattr(args, which.lower()), f"{tmp}/plan.json", path], check=True)
        runs[which].append(json.load(open(path)))
    plan_cells = json.load(open(f"{tmp}/plan.json"))
    names = list(plan_cells[0]["params"])
    table = []
    for c, cell in enumerate(plan_cells):
        row = {"cell": runs["A"][0]["cells"][c]["cell"], "source": cell["source"], "params": cell["params"]}
        for name in names:
            a = [r["cells"][c]["tflops"][name] for r in runs["A"]]
            b = [r["cells"][c]["tflops"][name] for r in runs["B"]]
            row[name] = {"A": sum(a) / 2, "B": sum(b) / 2, "B/A": sum(b) / sum(a),
                         "spread A": max(a) / min(a) - 1, "spread B": max(b) / min(b) - 1}
        table.append(row)
    result = {"dtype": args.dtype, "A": {"template": args.a, "hash": runs["A"][0]["template_hash"]},
              "B": {"template": args.b, "hash": runs["B"][0]["template_hash"]}, "cells": table}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"A = {args.a} ({result['A']['hash']}), B = {args.b} ({result['B']['hash']}); backward TFLOP/s, mean of 2 runs each")
    print(f"{'cell':34s}" + "".join(f"{n + ' A':>14s}{n + ' B':>14s}{'B/A':>7s}" for n in names))
    for row in table:
        print(f"{row['cell']:34s}" + "".join(f"{row[n]['A']:14.1f}{row[n]['B']:14.1f}{row[n]['B/A']:7.3f}" for n in names))
    for n in names:
        for d in (64, 128):
            sel = [r[n] for r in table if f"D={d} " in r["cell"]]
            print(f"geomean B/A {n:10s} D={d}: {geomean(x['B/A'] for x in sel):.3f}  "
                  f"(largest run-to-run spread A {max(x['spread A'] for x in sel):.1%}, B {max(x['spread B'] for x in sel):.1%})")
        print(f"geomean B/A {n:10s} all  : {geomean(r[n]['B/A'] for r in table):.3f}")


if __name__ == "__main__":
    main()
