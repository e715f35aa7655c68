"""The Gluon experiments (benchmarks/experiments/gluon_fwd.py, gluon_bwd.py) compile for sm90
without a GPU, and their machine code is what they are for: the overlapped forms wait for
one wgmma group while another is in flight, the serial control never does, the backward
kernels' exponentials run under their dP matmul, and the warp-specialised form moves registers between
partitions. (In the forward kernels ptxas moves the wait for P·V ahead of the
exponentials, docs/perf-notes.md v20: after the mask's branch in the key loop and with the
barrier that hands the slot back, as v59 found for the forward template.) What they compute is checked on the GPU by the
experiments themselves (they run each variant through flash-attention's rule)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parent.parent / "benchmarks" / "experiments"

# Runs in a child without TRITON_INTERPRET: Gluon kernels only compile.
_CHILD = textwrap.dedent(r"""
    import importlib.util, json, re, sys
    from pathlib import Path

    def load(name):
        spec = importlib.util.spec_from_file_location(name, Path(sys.argv[1]) / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    fwd, bwd = load("gluon_fwd"), load("gluon_bwd")
    out = {}
    for name, kernel in (
            ("fwd overlap", fwd.compiled((128, 128, 2, "overlap"), 128, False)),
            ("fwd serial", fwd.compiled((128, 128, 2, "serial"), 128, False)),
            ("fwd ws2 causal", fwd.compiled((128, 128, 2, "ws2"), 128, True)),
            ("bwd dkdv overlap causal", bwd.compiled("dkdv", (128, 64, 2, "overlap"), 128, True)),
            ("bwd dq overlap", bwd.compiled("dq", (128, 64, 2, "overlap"), 64, False)),
            ("bwd dq serial", bwd.compiled("dq", (128, 64, 2, "serial"), 64, False))):
        regs, spill, sass = fwd.resources(kernel, "k")
        # In SASS order, the waits for <= 1 (W) and for 0 (Z) outstanding wgmma groups, and the
        # exponentials (E): an E after a W and before the next Z runs while a matmul is in flight.
        waits = re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x([01])|(MUFU\.EX2)", sass)
        order = "".join("E" if ex2 else "WZ"[wait == "0"] for wait, ex2 in waits)
        out[name] = {"registers": regs, "spill": spill, "hgmma": sass.count("HGMMA"),
                     "wait_one": "W" in order, "exp_under_mma": re.search("W[^Z]*E", order) is not None,
                     "setmaxnreg": "USETMAXREG" in sass}
    print(json.dumps(out))
""")


def test_gluon_experiments_compile_for_sm90_and_overlap_their_matmuls():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _CHILD, str(EXPERIMENTS)], capture_output=True, text=True,
                       timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    for name, k in got.items():
        assert k["spill"] == 0 and k["hgmma"] > 0, (name, k)
    assert got["fwd overlap"]["wait_one"] and not got["fwd serial"]["wait_one"]
    assert got["fwd ws2 causal"]["setmaxnreg"] and got["fwd ws2 causal"]["wait_one"]
    assert got["bwd dkdv overlap causal"]["wait_one"] and got["bwd dq overlap"]["wait_one"]
    # The backward's exponentials run while its dP matmul is in flight; the serial control's do not.
    assert got["bwd dkdv overlap causal"]["exp_under_mma"] and got["bwd dq overlap"]["exp_under_mma"]
    assert not got["bwd dq serial"]["exp_under_mma"]


def test_package_ab_report_shows_a_cut_short_pass_as_missing(tmp_path):
    """benchmarks/experiments/package_ab.py's report: each cell's median time over the base's,
    cuDNN-normalised and raw; a version that has no run of a cell (its pass stopped) shows a
    dash there, and its geomeans say over how many cells they ran."""
    records = tmp_path / "ab.jsonl"
    rows = [("main", "fp16 D64 N512 full", 1.0, 1.0), ("main", "fp16 D64 N512 causal", 2.0, 1.0),
            ("new", "fp16 D64 N512 full", 0.9, 1.0), ("main", "fp16 D64 N512 full", 1.2, 1.2)]
    records.write_text("".join(
        json.dumps({"tag": tag, "cell": cell, "ms": ms, "cudnn_ms": cudnn,
                    "label": "m128 n128 w8 s2 tma_host persistent1 gluon2"}) + "\n"
        for tag, cell, ms, cudnn in rows))
    out = subprocess.run([sys.executable, str(EXPERIMENTS / "package_ab.py"), "report", str(records), "main"],
                         capture_output=True, text=True, check=True).stdout
    full = next(line for line in out.splitlines() if line.startswith("fp16 D64 N512 full"))
    causal = next(line for line in out.splitlines() if line.startswith("fp16 D64 N512 causal"))
    # main's two runs: normalised 1.0 and 1.0, raw 1.0 and 1.2 (median 1.1)
    assert full.split()[-3:] == ["0.900", "/", "0.818"]
    assert causal.split()[-3:] == ["-", "/", "-"]
    assert "geomean Gluon persistent, new (1 of 2 cells): 0.900" in out
