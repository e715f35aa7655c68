"""benchmarks/carry_over.py: tuned entries survive a template change where, and only where,
the code of their variant did not change."""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from fa2gen.generator.rendering import template_hash
from fa2gen.store import yamlfile

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "carry_over.py"
SHIPPED = ROOT / "tuned_configs" / "sm90" / "NVIDIA_H200.yaml"


def _module():
    spec = importlib.util.spec_from_file_location("carry_over", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_code_compares_without_comments_docstrings_or_layout():
    normalised = _module().normalised
    a = 'def f(x):\n    """Doc."""\n    # why\n    return x + 1\n'
    b = 'def f(x):\n    """Other doc."""\n    return (x +\n            1)  # note\n'
    c = 'def f(x):\n    """Doc."""\n    return x + 2\n'
    assert normalised(a) == normalised(b) != normalised(c)


def _carry(old: Path, out: Path) -> subprocess.CompletedProcess:
    # this checkout's package renders the new code, whatever else is installed
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [sys.executable, str(SCRIPT), str(old), str(SHIPPED), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return r


def test_entries_carry_over_where_their_code_is_unchanged(tmp_path):
    shipped = yamlfile.read(SHIPPED)
    fwd = [e for e in shipped.entries if e.bucket.direction == "fwd"]
    gluon = {e.bucket.key for e in fwd if e.params.gluon}
    assert gluon and len(gluon) < len(fwd)

    # The old package the same as this one: every entry kept, under this version's hash.
    _carry(ROOT, tmp_path / "same.yaml")
    same = yamlfile.read(tmp_path / "same.yaml")
    assert [(e.bucket, e.params, e.measurement) for e in same.entries] == [
        (e.bucket, e.params, e.measurement) for e in shipped.entries
    ]
    assert {e.validity.template_hash for e in same.entries if e.bucket.direction == "fwd"} == {template_hash("fwd")}

    # An old package whose Gluon forward template differs in code (not in a comment): its
    # entries need tuning again, the Triton template's carry over, the backward's pass through.
    old = tmp_path / "old"
    shutil.copytree(ROOT / "fa2gen", old / "fa2gen")
    gluon_template = old / "fa2gen" / "templates" / "attn_fwd_gluon.py.jinja"
    text = gluon_template.read_text()
    assert "LOADER_REGS = gl.constexpr(24)" in text
    gluon_template.write_text(
        text.replace("LOADER_REGS = gl.constexpr(24)", "LOADER_REGS = gl.constexpr(32)").replace(
            "# Warp specialisation:", "# (a comment that changed) Warp specialisation:"
        )
    )
    r = _carry(old, tmp_path / "carried.yaml")
    carried = yamlfile.read(tmp_path / "carried.yaml")
    kept = {e.bucket.key for e in carried.entries if e.bucket.direction == "fwd"}
    assert kept == {e.bucket.key for e in fwd} - gluon
    assert [e for e in carried.entries if e.bucket.direction == "bwd"] == [
        e for e in shipped.entries if e.bucket.direction == "bwd"
    ]
    assert f"{len(kept)} of {len(fwd)} entries carried over" in r.stdout
    assert r.stderr.count("needs tuning again") == len(gluon)
