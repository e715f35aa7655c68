"""Registers, spills and shared memory of generated variants, without a GPU.

Compiles each variant for a target arch (default sm90) with Triton and runs the bundled
ptxas with -v on the PTX, the way the driver would assemble it. A variant that spills
registers heavily is a poor default whatever its tiles promise, and this costs no GPU
time. Writes JSON and prints one line per variant.

usage: python benchmarks/registers.py --direction bwd --head-dims 64,128,256 --out regs.json
       python benchmarks/registers.py --direction fwd --loads tma_host --mask none --head-dims 128 --out f.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import tempfile
from concurrent.futures import ProcessPoolExecutor

KERNELS = {"fwd": ("attn_fwd",), "bwd": ("attn_bwd_dkdv", "attn_bwd_dq")}
POINTERS = {"Q", "K", "V", "O", "DO", "DQ", "DK", "DV"}


def _signature(fn, constexprs: dict, dtype: str, loads: str) -> dict:
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in POINTERS and loads == "tma_host":  # host descriptors: block shape in the type
            rows = constexprs["BLOCK_M"] if name in ("Q", "O") else constexprs["BLOCK_N"]
            sig[name] = f"tensordesc<{dtype}[1,1,{rows},{constexprs['HEAD_DIM_PAD']}]>"
        elif name in POINTERS:
            sig[name] = f"*{dtype}"
        elif name in ("LSE", "DELTA"):
            sig[name] = "*fp32"
        elif name in ("sm_scale", "softcap"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def resources(job) -> dict:
    """{kernel: {registers, spill_bytes, shared}} for one (direction, head_dim, mask, params)."""
    direction, head_dim, mask, params_data, cc = job
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from fa2gen.generator.cache import load_module
    from fa2gen.generator.spec import KernelSpec, TuningParams

    spec = KernelSpec(direction=direction, head_dim=head_dim, mask=mask)
    params = TuningParams.from_dict(params_data)
    module = load_module(spec, params)
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    out = {}
    for name in KERNELS[direction]:
        fn = getattr(module, name)
        tiles = ({"BLOCK_M": params.block_m, "BLOCK_N": params.block_n} if direction == "fwd"
                 else {"OUTER": params.block_m, "INNER": params.block_n})
        constexprs = {"HEAD_DIM": head_dim, "HEAD_DIM_PAD": spec.head_dim_padded, **tiles}
        try:
            kernel = triton.compile(ASTSource(fn, signature=_signature(fn, constexprs, spec.dtype, params.loads),
                                                      constexprs=constexprs),
                                    target=GPUTarget("cuda", cc, 32),
                                    options={"num_warps": params.num_warps, "num_stages": params.num_stages})
        except Exception as e:  # a variant the compiler rejects is an answer too
            out[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[-1][:160] if str(e) else ''}"}
            continue
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "k.ptx")
            with open(path, "w") as f:
                f.write(kernel.asm["ptx"])
            arch = f"sm_{cc}a" if cc >= 90 else f"sm_{cc}"
            log = subprocess.run([ptxas, "-v", f"--gpu-name={arch}", path, "-o", os.devnull],
                                 capture_output=True, text=True).stderr
        regs = re.search(r"Used (\d+) registers", log)
        spill = re.search(r"(\d+) bytes spill stores", log)
        out[name] = {"registers": int(regs.group(1)) if regs else None,
                     "spill_bytes": int(spill.group(1)) if spill else 0, "shared": kernel.metadata.shared}
    return out


def main() -> None:
    from fa2gen.generator.arch import fits
    from fa2gen.generator.spec import KernelSpec, TuningParams

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--direction", default="bwd", choices=tuple(KERNELS))
    ap.add_argument("--head-dims", default="64,128,256")
    ap.add_argument("--mask", default="causal")
    ap.add_argument("--arch", default="sm90")
    ap.add_argument("--loads", default="pointer", choices=("pointer", "tma_host"))
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    cc = int(args.arch[2:])
    jobs = []
    steps = (16, 32, 64) if args.direction == "bwd" else (32, 64, 128)  # as in the tuner's spaces
    for d, bm, bn, w, st in itertools.product(map(int, args.head_dims.split(",")), (64, 128), steps, (4, 8), (1, 2, 3)):
        params = TuningParams(bm, bn, w, st, args.loads)
        if fits(KernelSpec(direction=args.direction, head_dim=d, mask=args.mask), params, args.arch) is None:
            jobs.append((args.direction, d, args.mask, params.to_dict(), cc))
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(resources, jobs))
    rows = [{"head_dim": j[1], "params": j[3], "kernels": r} for j, r in zip(jobs, results)]
    with open(args.out, "w") as f:
        json.dump({"arch": args.arch, "direction": args.direction, "mask": args.mask, "loads": args.loads,
                   "rows": rows}, f, indent=1)
    for row in rows:
        p = row["params"]
        cells = "  ".join(f"{k}: " + (v["error"] if "error" in v else
                                      f"{v['registers']} regs, {v['spill_bytes']} B spilled, {v['shared']} B smem")
                          for k, v in row["kernels"].items())
        print(f"D={row['head_dim']:3d} m{p['block_m']} n{p['block_n']} w{p['num_warps']} s{p['num_stages']}  {cells}")


if __name__ == "__main__":
    main()
