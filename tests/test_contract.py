"""What the templates render and where their variants fit, frozen for refactors.

For a dozen specs covering every template (fwd and bwd, Triton and Gluon, fp8, padded head
dims, windows and softcap): the set of renderable points (``param_space``, which applies every
``unsupported`` rule), and for a sample of them (every Gluon point, every 40th of the rest) the
code digest (``identity.code_digest``), the shared-memory estimate and ``fits`` on every arch.
Each is compared by its digest with ``tests/contract.json``. A change meant to alter them
regenerates the file (``python tests/test_contract.py --write``) and says so in its commit;
shipped entries whose code it changes must be tuned again (test_lookup.py fails until then).
"""

import hashlib
import json
import sys
from pathlib import Path

import pytest

from fa2gen.generator.arch import ARCHES, fits, smem_estimate
from fa2gen.generator.identity import code_digest
from fa2gen.generator.spec import KernelSpec, param_space

GOLDEN = Path(__file__).with_name("contract.json")
SPECS = [
    KernelSpec(direction=d, dtype=dt, head_dim=hd, mask=m, softcap=sc)
    for d, dt, hd, m, sc in (
        ("fwd", "fp16", 64, "none", False),
        ("fwd", "fp16", 128, "none", False),
        ("fwd", "bf16", 64, "causal", False),
        ("fwd", "bf16", 128, "causal", False),
        ("fwd", "fp16", 72, "local", True),
        ("fwd", "fp8e4m3", 64, "none", False),
        ("fwd", "fp8e4m3", 128, "causal", False),
        ("bwd", "fp16", 64, "none", False),
        ("bwd", "fp16", 128, "none", False),
        ("bwd", "bf16", 64, "causal", False),
        ("bwd", "bf16", 128, "causal", False),
        ("bwd", "fp16", 72, "local", True),
    )
]


def _key(spec: KernelSpec) -> str:
    return json.dumps(spec.to_dict(), sort_keys=True)


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def contract(spec: KernelSpec) -> dict:
    points = param_space(spec)
    sample = [p for i, p in enumerate(points) if p.gluon or i % 40 == 0]
    return {
        "space": _digest([p.to_dict() for p in points]),
        "code": _digest([[p.to_dict(), code_digest(spec, p)] for p in sample]),
        "limits": _digest([[p.to_dict(), smem_estimate(spec, p), [fits(spec, p, a) for a in ARCHES]] for p in sample]),
        "points": len(points),
        "sampled": len(sample),
    }


@pytest.mark.parametrize(
    "spec", SPECS, ids=lambda s: f"{s.direction}-{s.dtype}-d{s.head_dim}-{s.mask}-sc{int(s.softcap)}"
)
def test_templates_render_and_fit_as_recorded(spec):
    golden = json.loads(GOLDEN.read_text())
    assert contract(spec) == golden[_key(spec)]


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    GOLDEN.write_text(json.dumps({_key(s): contract(s) for s in SPECS}, indent=1, sort_keys=True) + "\n")
