"""Test setup. CPU tests run the generated kernels under Triton's interpreter, which
must be switched on before any generated module is imported."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _kernel_cache(tmp_path_factory, monkeypatch):
    # One fresh kernel cache per session keeps tests hermetic without re-rendering per test.
    cache = tmp_path_factory.getbasetemp() / "kernel-cache"
    monkeypatch.setenv("FA2GEN_CACHE_DIR", str(cache))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
