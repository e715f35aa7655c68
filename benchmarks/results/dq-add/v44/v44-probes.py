"""v44's ablations (perf-notes v44): with dq-adders-v44.patch applied, rewrite the Gluon
backward template once per probe (each removes or decouples one piece of the dQ hand-over),
time the 64 x 32 and 128 x 32 adder variants at fp16 D=128 N=4k, full and causal, in a fresh
process each, and restore the template. Writes $OUT/probe44.json: probe -> cell -> (ms, dK/dV
kernel ms). Run from the repository root."""
import json, os, subprocess, sys
T = "fa2gen/templates/attn_bwd_gluon.py.jinja"
orig = open(T).read()
ADDER_LOOP = "    for t in range(steps):\n        buf = t % 2\n"
ATOMIC = 'gl.atomic_add(head + rows * HEAD_DIM + d_off, part, mask=rows < Nq, sem="relaxed")'
HAND = ("        mbarrier.wait(dq_empty.index(buf), ((t // 2) & 1) ^ 1)\n"
        "        dqt_smem.index(buf).permute((1, 0)).store(dqt)\n"
        "        gl.thread_barrier()\n"
        "        mbarrier.arrive(dq_ready.index(buf), count=1)\n")
NOHAND = ("        if Nk < 0:\n            dqt_smem.index(buf).permute((1, 0)).store(dqt)\n")
DQMM = "dqt = warpgroup_mma(k_op.permute((1, 0)), ds_tile, dqt_init, use_acc=False, is_async=True)"
DQW = "dqt = warpgroup_mma_wait(1, deps=(dqt,))"
WAITR = "        mbarrier.wait(dq_ready.index(buf), (t // 2) & 1)\n"
ARRE = "        mbarrier.arrive(dq_empty.index(buf), count=1)\n"
PROBES = {
    "full": [],
    "noadd": [(ATOMIC, ATOMIC.replace("mask=rows < Nq", "mask=(rows < Nq) & (Nk < 0)"))],
    "nohand": [(HAND, NOHAND), (ADDER_LOOP, "    for t in range(0):\n        buf = t % 2\n")],
    "nodq": [(HAND, NOHAND), (ADDER_LOOP, "    for t in range(0):\n        buf = t % 2\n"), (DQMM, "dqt = dqt_init"), (DQW, "dqt = dqt")],
    "free": [(HAND, NOHAND), (WAITR, ""), (ARRE, "")],
    "nowaitempty": [("        mbarrier.wait(dq_empty.index(buf), ((t // 2) & 1) ^ 1)\n", "")],
}
RUN = r'''
import sys, json
sys.path.insert(0, "benchmarks/experiments")
import bwd_cells
from fa2gen.bench.timing import kernel_ms, measure
from fa2gen.generator.spec import TuningParams
from fa2gen.runtime.backward import BackwardLaunch
out = {}
for d, n, causal in [(128, 4096, False), (128, 4096, True)]:
    c = bwd_cells.Cell(d, n, causal, "fp16")
    for name, p in [("64x32", TuningParams(block_m=64, block_n=32, num_warps=4, num_stages=2, loads="tma_host", dq_mode="atomic", gluon=1)),
                    ("128x32", TuningParams(block_m=128, block_n=32, num_warps=8, num_stages=2, loads="tma_host", dq_mode="atomic", gluon=1))]:
        kept = BackwardLaunch(c.problem, p)
        c.run(kept)
        ms = measure(lambda: c.run(kept)).median_ms
        split = kernel_ms(lambda: c.run(kept), ("attn_bwd_dkdv",))
        out[f"{name} N{n} {'causal' if causal else 'full'}"] = (ms, split.get("attn_bwd_dkdv", 0.0))
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
        r = subprocess.run([sys.executable, "-c", RUN], capture_output=True, text=True, timeout=150)
        line = [l for l in r.stdout.splitlines() if l.startswith("RESULT ")]
        res[probe] = json.loads(line[0][7:]) if line else r.stderr[-1500:]
    except subprocess.TimeoutExpired:
        res[probe] = "timeout"
    print(probe, res[probe], flush=True)
open(T, "w").write(orig)
json.dump(res, open(os.path.join(os.environ["OUT"], "probe44.json"), "w"), indent=1)
