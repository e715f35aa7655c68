"""v45's probes (perf-notes v45): rewrite the Gluon backward template's DS_ROWS and DS_STAGES
(attn_bwd_dq_ds: queries a program, ring slots) once per probe, check and time dq_mode matmul
on 64 x 64 tiles at fp16 D=128 (N=4k full and causal, N=16k full) in a fresh process each, and
restore the template. Writes $OUT/probe45.json: probe -> cell -> (checked, ms, dQ kernel ms,
dK/dV kernel ms). Run from the repository root."""
import json, os, subprocess, sys
T = "fa2gen/templates/attn_bwd_gluon.py.jinja"
orig = open(T).read()
ROWS = "DS_ROWS = 128\n"
STG = "DS_STAGES = gl.constexpr(3)\n"
RUN = r'''
import sys, json
sys.path.insert(0, "benchmarks/experiments")
import bwd_cells
from fa2gen.bench.timing import kernel_ms, measure
from fa2gen.generator.spec import TuningParams
from fa2gen.runtime.backward import BackwardLaunch
out = {}
p = TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=2, loads="tma_host", dq_mode="matmul", gluon=1)
for d, n, causal in [(128, 4096, False), (128, 4096, True), (128, 16384, False)]:
    c = bwd_cells.Cell(d, n, causal, "fp16")
    kept = BackwardLaunch(c.problem, p)
    ok, said, ms = c.check_and_time(kept)
    split = kernel_ms(lambda: c.run(kept), ("attn_bwd_dq_ds", "attn_bwd_dkdv"))
    out[f"N{n} {'causal' if causal else 'full'}"] = (ok, ms, split.get("attn_bwd_dq_ds", 0.0), split.get("attn_bwd_dkdv", 0.0))
print("RESULT " + json.dumps(out))
'''
res = {}
for rows, stages in [(128, 3), (128, 2), (128, 4), (64, 3), (64, 4), (64, 6)]:
    src = orig.replace(ROWS, f"DS_ROWS = {rows}\n").replace(STG, f"DS_STAGES = gl.constexpr({stages})\n")
    open(T, "w").write(src)
    key = f"rows{rows} s{stages}"
    try:
        r = subprocess.run([sys.executable, "-c", RUN], capture_output=True, text=True, timeout=120)
        line = [l for l in r.stdout.splitlines() if l.startswith("RESULT ")]
        res[key] = json.loads(line[0][7:]) if line else r.stderr[-1500:]
    except subprocess.TimeoutExpired:
        res[key] = "timeout"
    print(key, res[key], flush=True)
open(T, "w").write(orig)
json.dump(res, open(os.path.join(os.environ["OUT"], "probe45.json"), "w"), indent=1)
