"""fa2gen under the other supported Tritons as well as the one the suite runs under.

The suite itself runs under the Triton of the test environment (3.6 in CI, the oldest
supported). These tests build environments beside it, virtual environments that see this
one's packages but have their own Triton (``FA2GEN_OTHER_TRITONS``, default 3.7.1, 3.8.0 and
3.9.0, what torch 2.12 to 2.15 require), and there:
- under the newest, compile every default and every shipped config for sm90
  (``tests/compile_all.py``) and run the compatibility and rendering tests and the
  interpreter's kernel checks;
- under the others, compile every default and shipped config that renders a Gluon template
  (where the versions differ) and run the compatibility tests.

The environment is kept under ``~/.cache/fa2gen/test-envs`` between runs. Building it needs
the package index: without it the tests skip, except under CI (``CI`` set), where they fail.
"""

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import triton

OTHERS = os.environ.get("FA2GEN_OTHER_TRITONS", "3.7.1,3.8.0,3.9.0").split(",")
NEWEST = max(OTHERS, key=lambda v: tuple(int(x) for x in v.split(".")[:2]))
TESTS = Path(__file__).parent
ROOT = TESTS.parent


def _unavailable(why: str):
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="module", params=OTHERS, ids=lambda v: f"triton{v}")
def other(request):
    """(the Triton version, the python of an environment that has it)."""
    version = request.param
    if triton.__version__ == version:
        pytest.skip(f"the suite already runs under Triton {version}")
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fa2gen" / "test-envs"
    env_dir = home / f"triton-{version}-py{sys.version_info.major}.{sys.version_info.minor}"
    python = env_dir / "bin" / "python"
    check = [str(python), "-c", "import triton, fa2gen; print(triton.__version__, fa2gen.__file__)"]
    found = subprocess.run(check, capture_output=True, text=True) if python.exists() else None
    if found is None or found.returncode or found.stdout.split()[0] != version:
        venv.EnvBuilder(system_site_packages=True, clear=True, with_pip=True).create(env_dir)
        got = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--no-deps", f"triton=={version}"],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if got.returncode:
            _unavailable(f"cannot install triton {version}: {got.stderr.strip()[-300:]}")
        found = subprocess.run(check, capture_output=True, text=True)
    installed, package = found.stdout.split()
    assert installed == version and Path(package).resolve().parent.parent == ROOT.resolve(), found.stdout
    return version, python


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTEST_ADDOPTS")}
    return {**env, **extra}


def test_every_default_and_shipped_config_compiles_for_sm90(other, tmp_path):
    version, python = other
    gluon_only = version != NEWEST
    r = subprocess.run(
        [
            str(python),
            str(TESTS / "compile_all.py"),
            "--arch",
            "sm90",
            "--workers",
            "2",
            *(["--gluon-only"] if gluon_only else []),
        ],
        capture_output=True,
        text=True,
        timeout=1500,
        env=_env(FA2GEN_CACHE_DIR=str(tmp_path)),
    )
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    assert lines, r.stderr[-3000:]
    summary = json.loads(lines[-1])
    assert summary["failures"] == {} and r.returncode == 0
    sys.path.insert(0, str(TESTS))
    try:
        from compile_all import variants
    finally:
        sys.path.remove(str(TESTS))
    assert summary["variants"] == len(variants("sm90", gluon_only=gluon_only)) >= (40 if gluon_only else 100)


# The compatibility hooks, rendering, the Gluon kernels' sm90 compiles (spills, ptxas's
# performance notes, exponentials under a matmul), and the kernels' checks against the
# reference under the interpreter (about 430 tests, 4 minutes): the forward's on odd shapes
# along each load path, the backward's and fp8's. Under the older others, the compatibility
# hooks alone.
_SAMPLE = [
    "tests/test_compat.py",
    "tests/test_render.py",
    "tests/test_gluon_forward.py::test_compiles_for_sm90_without_spills",
    "tests/test_gluon_backward.py::test_compiles_for_sm90_without_spills_in_loops",
    "tests/test_gluon_backward.py::test_the_gluon_kernels_run_their_exponentials_under_a_matmul",
    "tests/test_forward_interpreter.py::test_forward_matches_reference",
    "tests/test_forward_interpreter.py::test_rows_without_keys_are_zero_with_neg_inf_lse",
    "tests/test_backward_interpreter.py",
    "tests/test_fp8_interpreter.py",
]


def test_compat_and_interpreter_checks(other):
    version, python = other
    tests = _SAMPLE if version == NEWEST else _SAMPLE[:1]
    r = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        capture_output=True,
        text=True,
        timeout=1500,
        cwd=ROOT,
        env=_env(),
    )
    tail = r.stdout[-3000:]
    assert r.returncode == 0, tail + r.stderr[-2000:]
    assert " passed" in tail and " failed" not in tail
