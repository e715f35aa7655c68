"""Instructions per loop iteration of generated kernels, from their SASS, without a GPU.

Compiles a variant for sm90 as a GPU launch would specialise it (fa2gen.generator.ahead),
assembles it with the bundled ptxas, disassembles it with the bundled nvdisasm and counts,
for every loop that holds tensor-core instructions (HGMMA; QGMMA in fp8), its instructions, its HGMMAs,
its local-memory loads (LDL: spilled registers read back) and its exponentials, all of them and
those issued while a matmul is still in flight (after a wait that leaves one wgmma group
outstanding, before the wait for all). Loops nest: an outer loop's
count includes its inner loops. Also reports spills and ptxas's notes that it serialised the
wgmmas or dropped the register split (fa2gen.generator.ahead.performance_losses). A shorter
loop body for the same HGMMAs is less non-matmul work per FLOP; whether that is faster is for
the GPU to say. --opcodes also counts each kernel's
instructions by opcode over the whole kernel (e.g. MUFU.EX2 against FFMA, SHFL and PRMT).

usage: python benchmarks/sass_loops.py --direction bwd --head-dim 128 --mask none 128,32,8,3,pointer [...]
       python benchmarks/sass_loops.py --direction fwd --dtype fp8e4m3 --opcodes 128,128,8,2,tma_host,separate,0,2
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile


def loop_stats(sass: str) -> list[dict]:
    """Backward branches in disassembly order: each closes a loop from its target label."""
    labels, body = {}, []
    for line in sass.splitlines():
        label = re.match(r"\s*(\.L_x_\d+):", line)
        if label:
            labels[label.group(1)] = len(body)
            continue
        ins = re.search(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if ins:
            body.append(ins.group(1))
    loops = []
    for end, ins in enumerate(body):
        branch = re.search(r"BRA\s+.*?(\.L_x_\d+)", ins)
        start = labels.get(branch.group(1)) if branch else None
        if start is not None and start < end:
            span = body[start : end + 1]
            hgmma = sum("HGMMA" in x or "QGMMA" in x for x in span)
            if hgmma:
                loops.append(
                    {
                        "instructions": len(span),
                        "hgmma": hgmma,
                        "ldl": sum("LDL" in x for x in span),
                        "ex2": sum("MUFU.EX2" in x for x in span),
                        "ex2_in_flight": ex2_in_flight(span),
                    }
                )
    return loops


def ex2_in_flight(span: list[str]) -> int:
    """Exponentials issued while a wgmma group is in flight: after a wait that leaves one
    group outstanding (DEPBAR.LE gsb0, 0x1) and before the next wait for all (0x0)."""
    count, open_ = 0, False
    for ins in span:
        if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in ins:
            open_ = True
        elif "WARPGROUP.DEPBAR.LE gsb0, 0x0" in ins:
            open_ = False
        elif open_ and "MUFU.EX2" in ins:
            count += 1
    return count


def opcode_counts(sass: str) -> collections.Counter:
    """Instructions by opcode (with its modifiers, predicates dropped)."""
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T\d]+\s+)?([A-Z][A-Z0-9_.]*)", sass)
    return collections.Counter(ops)


def analyse(direction: str, head_dim: int, mask: str, params, arch: str = "sm90", dtype: str = "fp16") -> dict:
    from fa2gen.generator import ahead
    from fa2gen.generator.spec import KernelSpec

    spec = KernelSpec(direction=direction, dtype=dtype, head_dim=head_dim, mask=mask)
    out = {}
    for name, kernel in ahead.compiled_kernels(spec, params, arch):
        if name in ahead.PASS_KERNELS:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            cubin = os.path.join(tmp, "k.cubin")
            report = ahead.assemble(kernel, arch, cubin, name=name)
            sass = subprocess.run(
                [ahead.nvidia_tool("nvdisasm"), "-c", cubin], capture_output=True, text=True, check=True
            ).stdout
        out[name] = {
            "spill_bytes": ahead.spill_bytes(report),
            "losses": ahead.performance_losses(report),
            "loops": loop_stats(sass),
            "opcodes": opcode_counts(sass),
        }
    return out


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
                f"{x['ex2_in_flight']}/{x['ex2']} EX2 under a matmul]"
                for x in r["loops"]
            )
            warn = "".join(f"  ptxas {loss}" for loss in r["losses"])
            print(f"D={args.head_dim} {args.mask} {params.label()} {name}: spills {r['spill_bytes']} B{warn}  {loops}")
            if args.opcodes:
                print("   ", "  ".join(f"{op} {n}" for op, n in r["opcodes"].most_common(30)))


if __name__ == "__main__":
    main()
