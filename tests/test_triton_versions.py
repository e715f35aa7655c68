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
import shutil
import subprocess
import sys
import tempfile
import threading
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


class Unavailable(Exception):
    """An environment that could not be built: the test skips (fails under CI)."""


def environment(version: str) -> Path:
    """The python of an environment that has Triton ``version``, built if missing."""
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
            raise Unavailable(f"cannot install triton {version}: {got.stderr.strip()[-300:]}")
        found = subprocess.run(check, capture_output=True, text=True)
    installed, package = found.stdout.split()
    if installed != version or Path(package).resolve().parent.parent != ROOT.resolve():
        raise Unavailable(f"the environment for triton {version} holds {found.stdout.strip()}")
    return python


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTEST_ADDOPTS")}
    return {**env, **extra}


# The compatibility hooks, rendering, the Gluon kernels' sm90 compiles (spills, ptxas's
# performance notes, exponentials under a matmul), and the kernels' checks against the
# reference under the interpreter (about 480 tests, 3 minutes): the forward's on odd shapes
# along each load path, the backward's, fp8's, packed batches' and the KV cache's. Under the
# older others, the compatibility hooks alone.
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
    "tests/test_varlen.py",
    "tests/test_kvcache.py",
]


def _command(version: str, python: Path, job: str, scratch: Path) -> tuple[list[str], dict]:
    """The command of one job ("compile" or "checks") under ``version``, and its environment."""
    if job == "compile":
        gluon = ["--gluon-only"] if version != NEWEST else []
        argv = [str(python), str(TESTS / "compile_all.py"), "--arch", "sm90", "--workers", "2", *gluon]
        return argv, _env(FA2GEN_CACHE_DIR=str(scratch))
    tests = _SAMPLE if version == NEWEST else _SAMPLE[:1]
    argv = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={scratch}", *tests]
    return argv, _env()


_JOBS = {
    "test_every_default_and_shipped_config_compiles_for_sm90": "compile",
    "test_compat_and_interpreter_checks": "checks",
}


class Beside:
    """The jobs of the collected tests, run one at a time in a background thread from the end
    of collection (``conftest.pytest_collection_finish``), beside the rest of the suite: they
    are most of its CPU time in separate processes, and the suite runs on one core."""

    def __init__(self, jobs: list[tuple[str, str]]):
        self.jobs = jobs
        self.done: dict[tuple[str, str], threading.Event] = {job: threading.Event() for job in jobs}
        self.results: dict = {}
        self.running: subprocess.Popen | None = None
        self.stopped = False
        self.scratch = Path(tempfile.mkdtemp(prefix="fa2gen-tritons-"))
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        pythons: dict = {}
        for version, job in self.jobs:
            try:
                if version not in pythons:
                    try:
                        pythons[version] = environment(version)
                    except Unavailable as e:
                        pythons[version] = e
                if isinstance(pythons[version], Unavailable) or self.stopped:
                    self.results[version, job] = pythons[version] if not self.stopped else Unavailable("stopped")
                    continue
                argv, env = _command(version, pythons[version], job, self.scratch / f"{version}-{job}")
                self.running = subprocess.Popen(
                    argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env
                )
                out, err = self.running.communicate(timeout=1500)
                self.results[version, job] = (self.running.returncode, out, err)
            except Exception as e:  # noqa: BLE001 - reported by the job's test
                self.results[version, job] = e
            finally:
                self.done[version, job].set()

    def result(self, version: str, job: str):
        if not self.done[version, job].wait(timeout=3000):
            raise TimeoutError(f"triton {version} {job} did not finish")
        return self.results[version, job]

    def stop(self) -> None:
        self.stopped = True
        if self.running is not None and self.running.poll() is None:
            self.running.kill()
        shutil.rmtree(self.scratch, ignore_errors=True)


_beside: Beside | None = None


def start_beside(items) -> None:
    """Start the jobs of the collected tests of this module (those not skipped for the installed
    Triton), the interpreter checks under the newest first (the longest)."""
    global _beside
    jobs = {
        (item.callspec.params["other"], _JOBS[item.originalname])
        for item in items
        if item.module.__name__ == __name__ and item.originalname in _JOBS
    }
    jobs = sorted((j for j in jobs if j[0] != triton.__version__), key=lambda j: (j != (NEWEST, "checks"), j))
    if jobs:
        _beside = Beside(jobs)


def stop_beside() -> None:
    if _beside is not None:
        _beside.stop()


def _job(version: str, job: str, scratch: Path):
    """(returncode, stdout, stderr) of a job: from the background run, or run here where it did
    not start one (a run that collected this test alone through another path)."""
    if _beside is not None and (version, job) in _beside.done:
        got = _beside.result(version, job)
    else:
        try:
            argv, env = _command(version, environment(version), job, scratch)
            r = subprocess.run(argv, capture_output=True, text=True, timeout=1500, cwd=ROOT, env=env)
            got = (r.returncode, r.stdout, r.stderr)
        except Unavailable as e:
            got = e
    if isinstance(got, Unavailable):
        _unavailable(str(got))
    if isinstance(got, Exception):
        raise got
    return got


@pytest.fixture(scope="module", params=OTHERS, ids=lambda v: f"triton{v}")
def other(request):
    """A supported Triton version other than the installed one."""
    if triton.__version__ == request.param:
        pytest.skip(f"the suite already runs under Triton {request.param}")
    return request.param


def test_every_default_and_shipped_config_compiles_for_sm90(other, tmp_path):
    code, stdout, stderr = _job(other, "compile", tmp_path)
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert lines, stderr[-3000:]
    summary = json.loads(lines[-1])
    assert summary["failures"] == {} and code == 0
    sys.path.insert(0, str(TESTS))
    try:
        from compile_all import variants
    finally:
        sys.path.remove(str(TESTS))
    gluon_only = other != NEWEST
    assert summary["variants"] == len(variants("sm90", gluon_only=gluon_only)) >= (40 if gluon_only else 100)


def test_compat_and_interpreter_checks(other, tmp_path):
    code, stdout, stderr = _job(other, "checks", tmp_path)
    tail = stdout[-3000:]
    assert code == 0, tail + stderr[-2000:]
    assert " passed" in tail and " failed" not in tail
