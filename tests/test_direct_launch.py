"""runtime.direct: a kept launch's kernels launched through their compiled launchers. The
launcher itself needs a GPU (tests/test_gpu.py runs attention() through it); here, which
calls may take it."""

import pytest
import torch

from fa2gen.runtime import direct


def test_the_signature_is_what_specialises_a_launch():
    t = torch.zeros(64, dtype=torch.float16)
    kept = direct.Signature([t, 96, 1, 0.5, "descriptor", t])
    assert kept.kept == ((96, 1), [(torch.float16, True), (torch.float16, True)])
    assert kept.matches([t[8:], 96, 1, 0.5, "descriptor", t])  # 16 bytes on: still aligned
    assert not kept.matches([t, 96, 1, 0.5, "descriptor", t[1:]])  # 2 bytes on: not
    assert not kept.matches([t.float(), 96, 1, 0.5, "descriptor", t])
    assert not kept.matches([t, 97, 1, 0.5, "descriptor", t])  # any int that differs
    assert not kept.matches([t, 96, 2, 0.5, "descriptor", t])
    assert kept.matches([t, 96, 1, 0.25, "other descriptor", t])  # floats, descriptors: not
    assert not kept.matches([t, 96, 1, 0.5, "descriptor"])  # (another binding)
    assert direct.Signature([0.5, "descriptor"]).matches([0.25, "other"])  # no int, no tensor


class _Kernel:
    """Test seam standing in for a Triton kernel on CPU: records launches through Triton."""

    def __init__(self):
        self.launched = []

    def __getitem__(self, grid):
        return lambda *args, **options: self.launched.append(args)


class _Direct:
    """Test seam standing in for a kept launcher: takes calls whose first argument is even."""

    def __init__(self):
        self.taken = []

    def __call__(self, args):
        if args[0] % 2:
            return False
        self.taken.append(args)
        return True


def test_launch_takes_the_kept_launcher_where_the_call_fits_it_and_triton_elsewhere(monkeypatch):
    kernel, kept = _Kernel(), {}
    monkeypatch.setattr(direct, "ENABLED", True)
    monkeypatch.setattr(direct.DirectKernel, "keep", classmethod(lambda cls, *a: _Direct()))
    for x in (2, 4, 5, 6):
        direct.launch(kept, "k", kernel, (1,), (x,), {})
    assert kernel.launched == [(2,), (5,)]  # the first call keeps the launcher; 5 does not fit it
    assert kept["k"].taken == [(4,), (6,)]


@pytest.mark.parametrize("enabled", [True, False])
def test_nothing_is_kept_where_it_cannot_be_or_is_not_enabled(monkeypatch, enabled):
    # A kernel without Triton's compiled pieces (here the seam; on CPU the interpreter's)
    # keeps nothing, and every call goes through Triton.
    kernel, kept = _Kernel(), {}
    monkeypatch.setattr(direct, "ENABLED", enabled)
    for x in range(3):
        direct.launch(kept, "k", kernel, (1,), (x,), {})
    assert kernel.launched == [(0,), (1,), (2,)]
    assert kept == ({"k": False} if enabled else {})


def test_direct_launches_are_the_default_and_an_env_var_turns_them_off(monkeypatch):
    import importlib

    before = direct.ENABLED
    try:
        for value, expected in ((None, True), ("0", False), ("1", True)):
            if value is None:
                monkeypatch.delenv("FA2GEN_DIRECT_LAUNCH", raising=False)
            else:
                monkeypatch.setenv("FA2GEN_DIRECT_LAUNCH", value)
            assert importlib.reload(direct).ENABLED is expected
        monkeypatch.setenv("FA2GEN_DIRECT_LAUNCH", "false")  # a value that reads as off but is not "0"
        with pytest.raises(ValueError, match="FA2GEN_DIRECT_LAUNCH"):
            importlib.reload(direct)
    finally:
        monkeypatch.delenv("FA2GEN_DIRECT_LAUNCH", raising=False)
        importlib.reload(direct)
        direct.ENABLED = before
