"""Print, for chosen variants, the loops of their SASS (fa2gen.generator.sass) without a GPU.

Compiles each variant for sm90 as a launch would specialise it, assembles it with the
bundled ptxas and disassembles it with the bundled nvdisasm. Per kernel: spills, ptxas's
notes that it serialised the wgmmas or dropped the register split, and for every loop with
tensor-core instructions its instructions, HGMMAs, local loads and exponentials (those under
a matmul in flight counted apart). --opcodes also counts each kernel's instructions by opcode
(e.g. MUFU.EX2 against FFMA, SHFL and PRMT).

usage: python benchmarks/sass_loops.py --direction bwd --head-dim 128 --mask none 128,32,8,3,pointer [...]
       python benchmarks/sass_loops.py --direction fwd --dtype fp8e4m3 --opcodes 128,128,8,2,tma_host,separate,0,2
"""

from __future__ import annotations

import argparse

from fa2gen.generator.sass import analyse


def main() -> None:
    from fa2gen.generator.spec import TuningParams

    ap = argparse.ArgumentParser()
    ap.add_argument("--direction", default="bwd", choices=("fwd", "bwd"))
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--mask", default="none")
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--arch", default="sm90")
    ap.add_argument("--opcodes", action="store_true", help="also count instructions by opcode")
    ap.add_argument(
        "params", nargs="+", help="block_m,block_n,num_warps,num_stages,loads[,dq_mode[,persistent[,gluon]]]"
    )
    args = ap.parse_args()
    for text in args.params:
        fields = [int(f) if f.isdigit() else f for f in text.split(",")]
        params = TuningParams(*fields)
        for name, r in analyse(args.direction, args.head_dim, args.mask, params, args.arch, args.dtype).items():
            loops = "  ".join(
                f"[{x['instructions']} ins, {x['hgmma']} HGMMA, {x['ldl']} LDL, "
                f"{x['ex2_in_flight']}/{x['ex2']} EX2 under a matmul, at most {x['ex2_run']} in a row]"
                for x in r["loops"]
            )
            warn = "".join(f"  ptxas {loss}" for loss in r["losses"])
            print(f"D={args.head_dim} {args.mask} {params.label()} {name}: spills {r['spill_bytes']} B{warn}  {loops}")
            if args.opcodes:
                print("   ", "  ".join(f"{op} {n}" for op, n in r["opcodes"].most_common(30)))


if __name__ == "__main__":
    main()
