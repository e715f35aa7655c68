"""v47c's ablations (perf-notes v47c): rewrite the one pass's Gluon template once per probe,
each removing one more piece of dQ's work, and time the 128 x 64 one pass at fp16 N=4k (D=128
full and causal, D=64 full) in a fresh process each; the template is restored after. Writes
$OUT/probe47.json: probe -> cell -> (ms, dK/dV kernel ms). Run from the repository root."""
import json, os, subprocess, sys
T = "fa2gen/templates/attn_bwd_gluon.py.jinja"
orig = open(T).read()


def guarded(block: str) -> str:
    # the block kept in the source (its values stay live) but never run
    return "        if Nk < 0:\n" + "".join("    " + l + "\n" for l in block.rstrip("\n").split("\n"))


HAND = """        mbarrier.wait(dq_empty.index(buf), ((t // 2) & 1) ^ 1)
        if DQT:
            dq_smem.index(buf).slice(G * DHALF, DHALF, dim=1).permute((1, 0)).store(dq)
        else:
            dq_smem.index(buf).slice(G * DHALF, DHALF, dim=1).store(dq)
        gl.thread_barrier()
        mbarrier.arrive(dq_ready.index(buf), count=1)
"""
ADDS = """        mbarrier.wait(dq_ready.index(buf), (t // 2) & 1)
        for r in gl.static_range(0, INNER, ADD_ROWS):
            part = dq_smem.index(buf).slice(r, ADD_ROWS, dim=0).load(layout)
            rows = q0 + r + r_off
            gl.atomic_add(head + rows * HEAD_DIM + d_off, part, mask=rows < Nq, sem="relaxed")
        gl.thread_barrier()
        mbarrier.arrive(dq_empty.index(buf), count=1)
"""
ATOMIC = 'gl.atomic_add(head + rows * HEAD_DIM + d_off, part, mask=rows < Nq, sem="relaxed")'
DQMM = """        if DQT:
            dq = warpgroup_mma(k0_cols.permute((1, 0)), ds_all.slice(0, HALF, dim=0), dq_init, use_acc=False,
                               is_async=True)
            dq = warpgroup_mma(k1_cols.permute((1, 0)), ds_all.slice(HALF, HALF, dim=0), dq, is_async=True)
        else:
            dq = warpgroup_mma(ds_all.slice(0, HALF, dim=0).permute((1, 0)), k0_cols, dq_init, use_acc=False,
                               is_async=True)
            dq = warpgroup_mma(ds_all.slice(HALF, HALF, dim=0).permute((1, 0)), k1_cols, dq, is_async=True)
        dv, dk, dq = warpgroup_mma_wait(0, deps=(dv, dk, dq))
"""
NODQMM = "        dq = dq_init\n        dv, dk = warpgroup_mma_wait(0, deps=(dv, dk))\n"
SHARE = """        mbarrier.wait(ds_empty.index(buf), ((t // 2) & 1) ^ 1)
        ds_smem.index(buf).slice(G * HALF, HALF, dim=0).store(ds16)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(ds_ready.index(buf), count=1)
        mbarrier.wait(ds_ready.index(buf), (t // 2) & 1)  # both halves in
"""
RELEASE = "        mbarrier.arrive(ds_empty.index(buf), count=1)  # this partition is done with the tile\n"
LAST = "        mbarrier.wait(ds_empty.index((n - 1) % 2), ((n - 1) // 2) & 1)\n"
NOHAND = [(HAND, guarded(HAND)), (ADDS, guarded(ADDS))]
NODQ = NOHAND + [(DQMM, NODQMM)]
PROBES = {
    "full": [],
    "noadd": [(ATOMIC, ATOMIC.replace("mask=rows < Nq", "mask=(rows < Nq) & (Nk < 0)"))],
    "nohand": NOHAND,
    "nodq": NODQ,
    "noshare": NODQ + [(SHARE, ""), (RELEASE, ""), (LAST, "        pass\n")],
}
RUN = r'''
import sys, json
sys.path.insert(0, "benchmarks/experiments")
import bwd_cells
from fa2gen.bench.timing import kernel_ms, measure
from fa2gen.generator.spec import TuningParams
from fa2gen.runtime.backward import BackwardLaunch
out = {}
variants = [("one pass", TuningParams(block_m=128, block_n=64, num_warps=8, num_stages=2, loads="tma_host", dq_mode="atomic", gluon=1))]
if sys.argv[1] == "full":  # the shipped dK/dV kernel's step without dS's store, for reference
    variants.append(("64x64 separate", TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=2, loads="tma_host", gluon=1)))
for d, n, causal in [(128, 4096, False), (128, 4096, True), (64, 4096, False)]:
    c = bwd_cells.Cell(d, n, causal, "fp16")
    for name, p in variants:
        kept = BackwardLaunch(c.problem, p)
        c.run(kept)
        ms = measure(lambda: c.run(kept)).median_ms
        split = kernel_ms(lambda: c.run(kept), ("attn_bwd_dkdv",))
        out[f"{name} D{d} N{n} {'causal' if causal else 'full'}"] = (ms, split.get("attn_bwd_dkdv", 0.0))
print("RESULT " + json.dumps(out))
'''
res = {}
for probe, subs in PROBES.items():
    src = orig
    for a, b in subs:
        assert src.count(a) == 1, (probe, a)
        src = src.replace(a, b)
    open(T, "w").write(src)
    try:
        r = subprocess.run([sys.executable, "-c", RUN, probe], capture_output=True, text=True, timeout=110)
        line = [l for l in r.stdout.splitlines() if l.startswith("RESULT ")]
        res[probe] = json.loads(line[0][7:]) if line else r.stderr[-1500:]
    except subprocess.TimeoutExpired:
        res[probe] = "timeout"
    print(probe, res[probe], flush=True)
open(T, "w").write(orig)
json.dump(res, open(os.path.join(os.environ["OUT"], "probe47.json"), "w"), indent=1)
