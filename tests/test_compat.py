"""fa2gen.compat, the one module that touches Triton's internals: each hook on the CPU, under
whichever supported Triton runs the tests (CI runs them under 3.6 and 3.9)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import compiled_child

from fa2gen import compat

PACKAGE = Path(compat.__file__).parent


def test_versions_parse_and_the_installed_one_is_supported():
    import triton

    assert compat.parse_version("3.9.0") == (3, 9)
    assert compat.parse_version("3.7.1+git1234abc") == (3, 7)
    assert compat.parse_version("3.10.0rc1") == (3, 10)
    with pytest.raises(ValueError, match="not a Triton version"):
        compat.parse_version("main")
    assert compat.version() == compat.parse_version(triton.__version__)
    assert compat.supported()
    assert not compat.supported((3, 5)) and not compat.supported((3, 10))


def test_gluon_names_are_this_tritons_builtins():
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import tma

    new = compat.version() >= (3, 8)
    assert compat.barrier is (gl.barrier if compat.version() >= (3, 7) else gl.thread_barrier)
    assert compat.tma_load is (tma.async_load if new else tma.async_copy_global_to_shared)
    assert compat.tma_store is (tma.async_store if new else tma.async_copy_shared_to_global)
    if new:
        assert compat.tma_add is tma.async_atomic_add
    for name in compat.GLUON_NAMES:  # the JIT calls only builtins it recognises
        assert getattr(getattr(compat, name), "__triton_builtin__", False), name
    with pytest.raises(AttributeError):
        compat.no_such_name  # noqa: B018


def test_nvmma_layout_is_the_swizzled_one_wgmma_reads():
    layout = compat.nvmma_layout((1, 1, 64, 128), "fp16")
    assert type(layout).__name__ == "NVMMASharedLayout"
    assert layout.swizzle_byte_width == 128 and layout.element_bitwidth == 16
    assert compat.nvmma_layout((1, 1, 64, 128), "fp8e4m3").element_bitwidth == 8


@pytest.mark.parametrize("gluon", [False, True], ids=["triton", "gluon"])
def test_descriptors_built_field_by_field_equal_the_constructors(gluon):
    import dataclasses

    t = torch.randn(2, 3, 40, 64, dtype=torch.float16)
    box = [1, 1, 32, 64]
    layout = compat.nvmma_layout(tuple(box), "fp16") if gluon else None
    cls, defaults = compat._descriptor_class(gluon)
    assert defaults is not None, "this Triton's descriptor has fields fa2gen does not know: update _FIELD_DEFAULTS"
    built = compat.descriptor_maker(box, layout)(t)
    made = cls(t, list(t.shape), list(t.stride()), box, *((layout,) if gluon else ()))
    assert type(built) is cls
    for f in dataclasses.fields(cls):
        a, b = getattr(built, f.name), getattr(made, f.name)
        assert (a is b) if f.name == "base" else (a == b), f.name


def test_bad_boxes_are_refused():
    compat.check_box((1, 1, 64, 128))
    with pytest.raises(Exception):
        compat.check_box((1, 1, 48, 128))  # not a power of two


def test_allocator_is_set_only_where_none_was():
    import threading

    import triton
    from triton.runtime import _allocation

    seen = {}

    def mine(size, alignment, stream):
        return torch.empty(size, dtype=torch.int8)

    def theirs(size, alignment, stream):
        return torch.empty(size, dtype=torch.int8)

    def fresh_thread():  # Triton's allocator is a context variable: null in every new thread
        compat.ensure_allocator(mine)
        seen["first"] = _allocation._allocator.get()
        triton.set_allocator(theirs)
        compat.ensure_allocator(mine)
        seen["kept"] = _allocation._allocator.get()

    worker = threading.Thread(target=fresh_thread)
    worker.start()
    worker.join()
    assert seen["first"] is mine and seen["kept"] is theirs


def test_launch_hooks_count_as_set_only_when_something_is_in_them(monkeypatch):
    # Triton's hooks are chains that are never None: an empty chain must not stop direct
    # launches; a profiler's hook in it, or in its place, must.
    from triton import knobs
    from triton.knobs import HookChain

    enter, leave = HookChain(), HookChain(reversed=True)
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", enter)
    monkeypatch.setattr(knobs.runtime, "launch_exit_hook", leave)
    assert not compat.launch_hooked()
    leave.add(print)
    assert compat.launch_hooked()
    leave.remove(print)
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", None)  # how older Tritons say "none"
    assert not compat.launch_hooked()
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", print)  # a hook set in the chain's place
    assert compat.launch_hooked()
    debug, mode = compat.launch_modes()
    assert isinstance(debug, bool) and mode == knobs.compilation.instrumentation_mode


def test_no_launcher_is_kept_without_a_gpu():
    class NotAKernel:
        pre_run_hooks = []

        def warmup(self, *args, **kwargs):
            raise RuntimeError("no GPU")

    assert compat.keep_launcher(NotAKernel(), (1,), (1, 2), {}) is None
    assert compat.pre_run_hooks(NotAKernel()) == []


def test_interpreter_patches_are_installed_once():
    from triton.runtime import interpreter

    compat.patch_interpreter()
    dot, convert = interpreter.InterpreterBuilder.create_dot, interpreter._convert_float
    compat.patch_interpreter()
    assert interpreter.InterpreterBuilder.create_dot is dot and interpreter._convert_float is convert
    assert dot.__module__ == "fa2gen.compat" and hasattr(interpreter.InterpreterBuilder, "create_descriptor_reduce")


def test_interpreter_numpy_check_names_triton_36_only():
    import numpy as np

    numpy_new = tuple(int(x) for x in np.__version__.split(".")[:2]) >= (2, 4)
    assert compat.interpreter_numpy_ok() == (compat.version() >= (3, 7) or not numpy_new)


# Runs without TRITON_INTERPRET (this test process has it set for the interpreter).
_ASSEMBLE = """
import re, sys, subprocess, tempfile, os
import triton, triton.language as tl
from fa2gen import compat

@triton.jit
def add_one(X, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(X + i, tl.load(X + i) + 1)

k = compat.compile_triton(add_one, {"X": "*fp32", "N": "constexpr"}, {"N": 128}, {}, "sm90",
                          {"num_warps": 4})
ptx = k.asm["ptx"]
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "k.ptx")
    open(path, "w").write(ptx)
    done = subprocess.run([compat.ptxas("sm90"), "--gpu-name=sm_90a", path, "-o", os.devnull],
                          capture_output=True, text=True)
print(re.search(r"\\.version (\\d+\\.\\d+)", ptx).group(1), done.returncode)
print(done.stderr.strip()[:300])
"""


def test_ptxas_reads_the_ptx_this_triton_emits(tmp_path):
    """The ptxas compat picks assembles what this Triton emits for sm90 (3.9's PTX is newer
    than the older of its two ptxas reads)."""
    script = tmp_path / "assemble.py"  # (a @jit function needs a file of its own)
    script.write_text(_ASSEMBLE)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    first, *rest = r.stdout.strip().splitlines()
    isa, code = first.split()
    assert code == "0", f"ptxas refused PTX ISA {isa}: {rest}"
    assert os.path.basename(compat.ptxas("sm90")).startswith("ptxas")


_SUM = r"""
import re
import triton, triton.language as tl
from fa2gen import compat

@triton.jit
def total(X, Y, N: tl.constexpr):
    tl.store(Y, tl.sum(tl.load(X + tl.arange(0, N)), 0))

# one warp, 1024 values: 32 in each thread, added there before the lanes are
ptx = compat.compile_triton(total, {"X": "*fp32", "Y": "*fp32", "N": "constexpr"}, {"N": 1024}, {}, "sm90",
                            {"num_warps": 1}).asm["ptx"]
depth = {}
for dst, a, b in re.findall(r"add\.f32\s+(%\w+), (%\w+), (%\w+);", ptx):
    depth[dst] = 1 + max(depth.get(a, 0), depth.get(b, 0))
print(max(depth.values()))
"""


_FUSE = """
import triton, triton.language as tl
from fa2gen import compat

@triton.jit
def fused(X, N: tl.constexpr):
    i = tl.arange(0, N)
    x = tl.load(X + i)
    tl.store(X + i, x * x + 1.0)

k = compat.compile_triton(fused, {"X": "*fp32", "N": "constexpr"}, {"N": 128}, {}, "sm90", {"num_warps": 4})
print(k.metadata.enable_fp_fusion, "fma.rn.f32" in k.asm["ptx"])
"""


def test_sums_in_tree_says_how_this_triton_adds_a_threads_values(tmp_path):
    """The Gluon forward chooses its row sum by compat.sums_in_tree: checked against what the
    installed Triton emits for a reduction of 32 values a thread (and 32 lanes): one chain is
    at least 31 adds deep, a tree about 10."""
    script = tmp_path / "sum.py"
    script.write_text(_SUM)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    depth = int(r.stdout.split()[-1])
    assert (depth <= 16) == compat.sums_in_tree(), depth
    assert compat.sums_in_tree((3, 8)) and compat.sums_in_tree((3, 9)) and not compat.sums_in_tree((3, 7))


_BWD_FORMS = r"""
import json, re
from fa2gen import compat
from fa2gen.generator import ahead
from fa2gen.generator.spec import KernelSpec, TuningParams

# The forms the two hooks stand in for: the Gluon backward as it renders with both off
compat.barrier_at_first_reader = compat.carried_accumulator_serialises = lambda ver=None: False
spec = KernelSpec(direction="bwd", dtype="bf16", head_dim=128)
kernels = dict(ahead.compiled_kernels(spec, TuningParams(64, 64, 4, 2, "tma_host", gluon=2), "sm90"))
# dK/dV: is there a barrier between the loop's first matmul group and its second?
ptx = kernels["attn_bwd_dkdv"].asm["ptx"]
body = ptx[ptx.index("wgmma.commit_group"):]
between = body[: body.index("wgmma.fence")]
# dQ (its dQ matmul in flight across steps): does ptxas serialise the wgmmas?
report = ahead.assemble(kernels["attn_bwd_dq"], "sm90", "/dev/null", name="attn_bwd_dq")
print(json.dumps(["bar.sync" in between, any(x.startswith("C7515") for x in ahead.performance_losses(report))]))
"""


def test_the_backward_hooks_say_what_this_triton_does_to_the_gluon_backward():
    """compat.barrier_at_first_reader and carried_accumulator_serialises, checked against what
    the installed Triton and its ptxas make of the Gluon backward rendered without their
    remedies: a barrier between the dK/dV loop's first two matmuls, and serialised wgmmas in
    the dQ kernel, whose dQ matmul stays in flight across steps."""
    barrier_between, serialised = compiled_child(_BWD_FORMS)
    assert barrier_between == compat.barrier_at_first_reader()
    assert serialised == compat.carried_accumulator_serialises()
    for hook in (compat.barrier_at_first_reader, compat.carried_accumulator_serialises):
        assert hook((3, 7)) and hook((3, 9)) and not hook((3, 6))


def test_every_compile_and_launch_asks_for_fused_multiply_adds(tmp_path):
    """enable_fp_fusion is requested, not left to Triton's default (3.9 warns that it turns
    False in 3.10): with the default switched off, compiles still fuse, and the runtime's
    launches and warmups pass the request."""
    from fa2gen.runtime import direct

    script = tmp_path / "fuse.py"
    script.write_text(_FUSE)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_DEFAULT_FP_FUSION": "0"}
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["True", "True"]

    calls = []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **options: calls.append(("run", options))

        def warmup(self, *args, grid, **options):
            calls.append(("warmup", options))

    direct.launch({}, "k", Kernel(), (1,), (), {"BLOCK": 16})
    direct.warmup(Kernel(), (1,), (), {"BLOCK": 16})
    assert [kind for kind, _ in calls[:1]] == ["run"] and calls[-1][0] == "warmup"
    assert calls and all(options == {"BLOCK": 16, "enable_fp_fusion": True} for _, options in calls)
    assert compat.codegen({"enable_fp_fusion": False}) == {"enable_fp_fusion": False}  # an explicit choice stands


# Public Triton: the package, its language and testing modules, and the Gluon language the
# templates are written in.
_PUBLIC = {
    "triton",
    "triton.language",
    "triton.testing",
    "triton.experimental",
    "triton.experimental.gluon",
    "triton.experimental.gluon.language",
    "triton.experimental.gluon.language.nvidia.hopper",
}
_IMPORT = re.compile(r"^\s*(?:from\s+(triton[\w.]*)\s+import\s+([\w, ()]+)|import\s+(triton[\w.]*))", re.M)


def test_nothing_but_compat_imports_triton_internals():
    """Every module of the package and every template imports only public Triton (and the
    Gluon language); everything else goes through fa2gen.compat."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")) + sorted((PACKAGE / "templates").glob("*.jinja")):
        if path.name == "compat.py":
            continue
        source = path.read_text()
        for module, names, plain in _IMPORT.findall(source):
            module = module or plain
            private = any(n.strip().startswith("_") for n in names.strip("()").split(","))
            if module not in _PUBLIC or private:
                offenders.append(f"{path.relative_to(PACKAGE)}: {module} {names}".strip())
        offenders += [
            f"{path.relative_to(PACKAGE)}: {m}"
            for m in re.findall(
                r"\btriton\.(?:_(?!_)\w+|runtime|compiler|"
                r"backends|knobs|tools)\b",
                source,
            )
        ]
    assert not offenders, offenders
