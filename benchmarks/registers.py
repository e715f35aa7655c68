"""Registers, spills and shared memory of generated variants, without a GPU.

Compiles each variant for a target arch (default sm90) with Triton and runs the bundled
ptxas with -v on the PTX (``fa2gen.generator.ahead``). A variant that spills
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
from concurrent.futures import ProcessPoolExecutor


def resources(job) -> dict:
    """{kernel: {registers, spill_bytes, shared}} for one (direction, head_dim, mask, params, arch)."""
    direction, head_dim, mask, params_data, arch = job
    from fa2gen.generator.ahead import compile_for
    from fa2gen.generator.spec import KernelSpec, TuningParams

    try:
        found = compile_for(
            KernelSpec(direction=direction, head_dim=head_dim, mask=mask), TuningParams.from_dict(params_data), arch
        )
    except Exception as e:  # a variant the compiler rejects is an answer too
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[-1][:160] if str(e) else ''}"}
    return {
        name: {"registers": r.registers, "spill_bytes": r.spill_bytes, "shared": r.shared_bytes}
        for name, r in found.items()
    }


def main() -> None:
    from fa2gen.generator.arch import fits
    from fa2gen.generator.spec import KernelSpec, TuningParams

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--direction", default="bwd", choices=("fwd", "bwd"))
    ap.add_argument("--head-dims", default="64,128,256")
    ap.add_argument("--mask", default="causal")
    ap.add_argument("--arch", default="sm90")
    ap.add_argument("--loads", default="pointer", choices=("pointer", "tma_host"))
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    jobs = []
    steps = (16, 32, 64) if args.direction == "bwd" else (32, 64, 128)  # as in the tuner's spaces
    for d, bm, bn, w, st in itertools.product(map(int, args.head_dims.split(",")), (64, 128), steps, (4, 8), (1, 2, 3)):
        params = TuningParams(bm, bn, w, st, args.loads)
        if fits(KernelSpec(direction=args.direction, head_dim=d, mask=args.mask), params, args.arch) is None:
            jobs.append((args.direction, d, args.mask, params.to_dict(), args.arch))
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(resources, jobs))
    rows = [{"head_dim": j[1], "params": j[3], "kernels": r} for j, r in zip(jobs, results)]
    with open(args.out, "w") as f:
        json.dump(
            {"arch": args.arch, "direction": args.direction, "mask": args.mask, "loads": args.loads, "rows": rows},
            f,
            indent=1,
        )
    for row in rows:
        p = row["params"]
        kernels = row["kernels"]
        cells = (
            kernels["error"]
            if "error" in kernels
            else "  ".join(
                f"{k}: {v['registers']} regs, {v['spill_bytes']} B spilled, {v['shared']} B smem"
                for k, v in kernels.items()
            )
        )
        print(f"D={row['head_dim']:3d} m{p['block_m']} n{p['block_n']} w{p['num_warps']} s{p['num_stages']}  {cells}")


if __name__ == "__main__":
    main()
