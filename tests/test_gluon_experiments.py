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
