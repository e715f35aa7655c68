"""Test setup.

Without a GPU, kernels run under Triton's interpreter, which must be switched on
before triton is imported. Tests marked ``interpreter`` run kernels on CPU tensors
and need it; tests marked ``gpu`` need CUDA and compiled kernels. One process can
hold only one of the two modes, so each run skips the other kind.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@pytest.fixture(autouse=True)
def _kernel_cache(tmp_path_factory, monkeypatch):
    # One fresh kernel cache per session keeps tests hermetic without re-rendering per test.
    cache = tmp_path_factory.getbasetemp() / "kernel-cache"
    monkeypatch.setenv("FA2GEN_CACHE_DIR", str(cache))
    # Never read or write the user's tuned database from tests.
    monkeypatch.setenv("FA2GEN_DB", str(tmp_path_factory.getbasetemp() / "no-tuned.sqlite"))


def pytest_collection_modifyitems(config, items):
    gpu_ok = torch.cuda.is_available() and not INTERPRETING
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU with compiled (not interpreted) kernels")
    skip_interp = pytest.mark.skip(reason="needs TRITON_INTERPRET=1 (the default without a GPU)")
    both = [item.nodeid for item in items if "gpu" in item.keywords and "interpreter" in item.keywords]
    if both:  # skipped on every machine: a GPU run is never interpreted
        raise pytest.UsageError(f"marked both gpu and interpreter, so never run: {both[:3]}")
    for item in items:
        if "gpu" in item.keywords and not gpu_ok:
            item.add_marker(skip_gpu)
        if "interpreter" in item.keywords and not INTERPRETING:
            item.add_marker(skip_interp)


def pytest_collection_finish(session):
    # The other Tritons' jobs (test_triton_versions) start now and run beside the rest of the
    # suite, whose own tests then only collect their results.
    if session.config.option.collectonly:
        return
    for module in {item.module for item in session.items if hasattr(getattr(item, "module", None), "start_beside")}:
        module.start_beside(session.items)


def pytest_sessionfinish(session):
    for module in {item.module for item in session.items if hasattr(getattr(item, "module", None), "stop_beside")}:
        module.stop_beside()
