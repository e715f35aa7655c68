"""Packaging: a wheel install finds and dispatches the shipped tuned configs, on every
supported Python, and the dependencies resolve beside each supported torch.

The wheel is built from a copy of the sources and installed into fresh virtual environments
outside the checkout; nothing here needs a GPU. The resolution check fetches package metadata
only (no wheels): without a network it is skipped, except in CI (CI set), where it fails.
"""

from __future__ import annotations

import concurrent.futures
import glob
import importlib.util
import json
import os
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

try:
    import tomllib
except ImportError:  # Python 3.10: pytest depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI", "").lower() not in ("", "0", "false")
H200_YAML = ROOT / "tuned_configs" / "sm90" / "NVIDIA_H200.yaml"
BUCKET = "fwd/bf16/d128/causal/sc0/g1/q4096/k4096/bh64"
# The inputs of the wheel (a copy, so that the build leaves no build/ folder in the checkout).
WHEEL_INPUTS = ("pyproject.toml", "README.md", "fa2gen", "tuned_configs")
OTHER_PYTHONS = ("3.10", "3.12", "3.13")
TORCH_MINORS = ("2.11", "2.12", "2.13", "2.14", "2.15")


def _env(**extra: str) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "FA2GEN_DISABLE_TUNED")
    }
    env.update(extra)
    return env


def _run(cmd, cwd: Path, timeout: float = 120, **extra_env: str) -> str:
    r = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=_env(**extra_env), capture_output=True, text=True, timeout=timeout
    )
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def _venv(python: str, where: Path, wheel: Path, outer_site: bool) -> Path:
    """A fresh venv at ``where`` with the wheel installed (no dependencies); its python.

    With ``outer_site``, the venv also sees the running interpreter's site-packages (torch,
    Triton, and the editable fa2gen, which the wheel's copy must shadow) through a .pth file:
    ``--system-site-packages`` would show the base interpreter's instead, when this one runs
    in a venv itself.
    """
    _run([python, "-m", "venv", where], cwd=where.parent)
    py = where / "bin" / "python"
    if outer_site:
        purelib = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=where).strip())
        dirs = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
        (purelib / "_outer_env.pth").write_text(
            "".join(f"import site; site.addsitedir({d!r})\n" for d in dirs if os.path.isdir(d))
        )
    # --ignore-installed: the outer fa2gen of the same version must not count as installed.
    _run(
        [py, "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", "-q", wheel],
        cwd=where,
        PIP_DISABLE_PIP_VERSION_CHECK="1",
    )
    return py


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in WHEEL_INPUTS:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, src / name)
    # Build with the setuptools at hand (no network); without one, pip fetches it.
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q", "-w", tmp / "dist", src], cwd=tmp)
    (found,) = (tmp / "dist").glob("fa2gen-*.whl")
    return found


def test_wheel_holds_the_tuned_configs(wheel):
    import zipfile

    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {n for n in names if n.startswith("fa2gen/tuned_configs/")}
    expected = {"fa2gen/tuned_configs/__init__.py", "fa2gen/tuned_configs/README.md"} | {
        f"fa2gen/tuned_configs/{p.relative_to(ROOT / 'tuned_configs').as_posix()}"
        for p in (ROOT / "tuned_configs").glob("*/*.yaml")
    }
    assert "fa2gen/tuned_configs/sm90/NVIDIA_H200.yaml" in expected
    assert shipped == expected


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """The venv's python: the running interpreter's packages plus the wheel's fa2gen."""
    tmp = tmp_path_factory.mktemp("venv")
    return _venv(sys.executable, tmp / "venv", wheel, outer_site=True)


def _in_venv(path: str, py: Path) -> bool:
    return Path(path).resolve().is_relative_to(py.parent.parent.resolve())


def _private_env(py: Path) -> dict:
    # No user database, a kernel cache of its own.
    home = py.parent.parent.parent
    return {"FA2GEN_DB": str(home / "none.sqlite"), "FA2GEN_CACHE_DIR": str(home / "kernels")}


def test_info_names_the_installed_configs(installed):
    out = _run([installed.parent / "fa2gen", "info"], cwd=installed.parent.parent.parent, **_private_env(installed))
    (line,) = [x for x in out.splitlines() if x.startswith("shipped configs: ")]
    root = line.removeprefix("shipped configs: ")
    assert root != "None", out
    assert _in_venv(root, installed), f"{root} is not the wheel's copy"
    assert (Path(root) / "sm90" / "NVIDIA_H200.yaml").is_file()


LOOKUP = """
import json
import fa2gen
import torch
from fa2gen.runtime import lookup
from fa2gen.runtime.device import DeviceInfo
from fa2gen.runtime.problem import make_problem
from fa2gen.store.shipped import shipped_root

# the bucket's shape: batch x heads 4 x 16 = 64, 4096 queries and keys, D 128, bf16, causal
q = torch.empty(4, 16, 4096, 128, dtype=torch.bfloat16, device="meta")
choice = lookup.choose(make_problem(q, q, q, causal=True), DeviceInfo("NVIDIA_H200", (9, 0), "sm90", 132))
print(json.dumps({"fa2gen": fa2gen.__file__, "torch": torch.__file__, "root": str(shipped_root()),
                  "source": choice.source, "bucket": choice.bucket and choice.bucket.key,
                  "params": choice.params.to_dict()}))
"""


def test_wheel_install_dispatches_shipped_configs(installed):
    from fa2gen.generator.spec import TuningParams

    data = yaml.safe_load(H200_YAML.read_text())
    (entry,) = [e for e in data["entries"] if e["bucket"] == BUCKET]
    out = _run([installed, "-c", LOOKUP], cwd=installed.parent.parent.parent, **_private_env(installed))
    got = json.loads(out.splitlines()[-1])
    assert _in_venv(got["fa2gen"], installed), f"imported {got['fa2gen']}, not the wheel's copy"
    assert not _in_venv(got["torch"], installed)
    assert _in_venv(got["root"], installed)
    assert (got["source"], got["bucket"]) == ("shipped", BUCKET)
    assert got["params"] == TuningParams(**entry["params"]).to_dict()


def _python(version: str) -> str | None:
    """An interpreter of ``version``: pyenv's newest patch release of it, else python3.X on PATH."""
    roots = [os.environ.get("PYENV_ROOT"), os.path.expanduser("~/.pyenv")]
    if shutil.which("pyenv"):
        r = subprocess.run(["pyenv", "root"], capture_output=True, text=True)
        roots.insert(0, r.stdout.strip() if r.returncode == 0 else None)
    for root in filter(None, roots):
        found = glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", "python"))
        found = [p for p in found if re.fullmatch(rf"{re.escape(version)}\.\d+", Path(p).parent.parent.name)]
        if found:
            return max(found, key=lambda p: int(Path(p).parent.parent.name.rsplit(".", 1)[1]))
    return shutil.which(f"python{version}")


FIND = """
import json, sys
import fa2gen
from fa2gen.store.shipped import shipped_root

root = shipped_root()
print(json.dumps({"fa2gen": fa2gen.__file__, "version": fa2gen.__version__, "root": root and str(root),
                  "yaml": sorted(p.relative_to(root).as_posix() for p in root.glob("*/*.yaml")) if root else [],
                  "torch imported": "torch" in sys.modules}))
"""


@pytest.mark.parametrize("version", OTHER_PYTHONS)
def test_other_pythons_find_the_configs(version, wheel, tmp_path):
    """A plain venv of another Python (no torch, nothing but the wheel) finds the package data."""
    python = _python(version)
    if python is None:
        pytest.skip(f"no Python {version} here (looked in pyenv's versions and for python{version} on PATH)")
    py = _venv(python, tmp_path / "venv", wheel, outer_site=False)
    got = json.loads(_run([py, "-c", FIND], cwd=tmp_path).splitlines()[-1])
    assert _in_venv(got["fa2gen"], py)
    assert got["root"] and _in_venv(got["root"], py), got
    assert "sm90/NVIDIA_H200.yaml" in got["yaml"]
    assert not got["torch imported"]


# --- dependency resolution beside each supported torch -------------------------------------------------


def _uv() -> str | None:
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        return shutil.which("uv")


NETWORK_ERROR = re.compile(
    r"dns error|error sending request|failed to fetch|client error \(connect\)|connection refused"
    r"|timed out|network is unreachable",
    re.IGNORECASE,
)


def _compile(uv: str, requirements: list[str], cwd: Path) -> tuple[int, str, str]:
    """Resolve ``requirements`` for Linux x86_64, Python 3.12: metadata only, nothing installed."""
    cmd = [
        uv,
        "pip",
        "compile",
        "--no-config",
        "--no-header",
        "--python-version",
        "3.12",
        "--python-platform",
        "x86_64-manylinux_2_28",
        "-",
    ]
    r = subprocess.run(
        cmd,
        input="\n".join(requirements) + "\n",
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
        env=_env(UV_PYTHON_DOWNLOADS="never"),
    )
    return r.returncode, r.stdout, r.stderr


def _pins(output: str) -> dict[str, tuple[str, str]]:
    """name -> (version, the "# via" lines below it) from uv's compiled requirements."""
    pins, name = {}, None
    for line in output.splitlines():
        m = re.match(r"([A-Za-z0-9_.-]+)==(\S+)", line)
        if m:
            name = m[1].lower()
            pins[name] = (m[2], "")
        elif name and line.lstrip().startswith("#"):
            pins[name] = (pins[name][0], pins[name][1] + line.strip() + "\n")
    return pins


def test_dependencies_resolve_beside_each_torch(tmp_path):
    uv = _uv()
    if uv is None:
        if IN_CI:
            pytest.fail("uv is missing (the dev extra installs it)")
        pytest.skip("uv is missing (pip install uv)")
    ours = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (triton_req,) = [Requirement(r) for r in ours if Requirement(r).name == "triton"]
    jobs = {
        (minor, alone): [f"torch=={minor}.*", *([] if alone else ours)]
        for minor in TORCH_MINORS
        for alone in (True, False)
    }
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        results = dict(zip(jobs, pool.map(lambda reqs: _compile(uv, reqs, tmp_path), jobs.values())))
    failed = {k: err for k, (rc, _, err) in results.items() if rc != 0}
    if failed and all(NETWORK_ERROR.search(err) for err in failed.values()):
        message = "package index unreachable: " + next(iter(failed.values())).strip().splitlines()[-1].strip()
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    assert not failed, "\n".join(f"torch {k[0]}{' alone' if k[1] else ''}:\n{err}" for k, err in failed.items())
    for minor in TORCH_MINORS:
        alone, with_ours = _pins(results[minor, True][1]), _pins(results[minor, False][1])
        torch_version, triton_version = with_ours["torch"][0], with_ours["triton"][0]
        assert torch_version.startswith(f"{minor}."), (minor, torch_version)
        # The Triton resolved beside fa2gen is the one torch itself requires ...
        assert "torch" in with_ours["triton"][1], with_ours["triton"]
        assert (torch_version, triton_version) == (alone["torch"][0], alone["triton"][0])
        # ... and lies in the range fa2gen declares.
        assert triton_req.specifier.contains(triton_version), (minor, triton_version, str(triton_req))
