"""Concurrent first calls: threads of one process, and processes sharing one kernel cache."""

import collections
import os
import subprocess
import sys
import threading
import time

import pytest
import torch
from helpers import rand_qkv

import fa2gen
from fa2gen import compat
from fa2gen.bench.correctness import check_forward
from fa2gen.generator.cache import module_path
from fa2gen.generator.identity import Variant
from fa2gen.generator.rendering import render
from fa2gen.generator.spec import KernelSpec, TuningParams
from fa2gen.runtime.dispatch import clear_memo
from fa2gen.runtime.problem import make_problem

# The other process of the cache test: rewrites a variant's module over and over (removing it
# first, so that every round writes it afresh), as a process that renders it for the first
# time does, until told to stop.
_WRITER = """
import os, sys
from pathlib import Path
from fa2gen.generator.cache import module_path, write_module
from fa2gen.generator.identity import Variant
from fa2gen.generator.spec import KernelSpec, TuningParams
variant = Variant(KernelSpec(head_dim=int(sys.argv[1]), mask="causal"), TuningParams(block_m=32))
path, stop, rounds = module_path(variant), Path(sys.argv[2]), 0
while not stop.exists() or rounds < 50:
    path.unlink(missing_ok=True)
    write_module(variant)
    rounds += 1
print(rounds)
"""


def test_a_module_another_process_is_writing_is_never_read_torn(tmp_path, monkeypatch):
    # Two processes sharing FA2GEN_CACHE_DIR: a module is written beside its final name and
    # moved into place, so a reader sees the whole file or none, never a part.
    monkeypatch.setenv("FA2GEN_CACHE_DIR", str(tmp_path / "kernels"))
    variant = Variant(KernelSpec(head_dim=88, mask="causal"), TuningParams(block_m=32))
    source = render(variant.spec, variant.params, name=variant.name)
    path, stop = module_path(variant), tmp_path / "stop"
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, "88", str(stop)], env=os.environ.copy(), stdout=subprocess.PIPE, text=True
    )
    seen, deadline = 0, time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            try:
                text = path.read_text()
            except FileNotFoundError:
                continue
            assert text == source, f"read {len(text)} of {len(source)} characters"
            compile(text, str(path), "exec")
            seen += 1
            if seen >= 300:
                break
    finally:
        stop.touch()
        rounds = int(writer.communicate(timeout=120)[0])
    assert writer.returncode == 0 and rounds >= 50
    assert seen >= 50, f"the module was in place only {seen} times"
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary left behind


def test_compile_counts_come_from_tritons_own_hook():
    # (the GPU test below counts compiles through compat.on_compile; a Triton without the
    # hook would make it count nothing and pass)
    from triton import knobs

    before = knobs.runtime.jit_post_compile_hook
    seen = []
    with compat.on_compile(lambda name, key: seen.append((name, key))):
        hook = knobs.runtime.jit_post_compile_hook
        assert hook is not None and hook is not before
        hook(key=("k",), fn=collections.namedtuple("F", "name")("attn_fwd"), repr="", compile={})
    assert seen == [("attn_fwd", "('k',)")]
    assert knobs.runtime.jit_post_compile_hook is before


def _first_calls_at_once(shapes, dtype, **options):
    """Each shape's attention() from its own thread, all released together: (results, compiles
    per (kernel, specialisation))."""
    inputs = [rand_qkv(*shape, dtype=dtype, device="cuda", seed=i) for i, shape in enumerate(shapes)]
    compiles = collections.Counter()
    results = [None] * len(shapes)
    start = threading.Barrier(len(shapes))

    def call(i):
        start.wait()
        try:
            results[i] = fa2gen.attention(*inputs[i], return_lse=True, **options)
        except Exception as e:  # noqa: BLE001 - reported by the test
            results[i] = e

    with compat.on_compile(lambda name, key: compiles.update([(name, key)])):
        threads = [threading.Thread(target=call, args=(i,)) for i in range(len(shapes))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    torch.cuda.synchronize()
    return inputs, results, compiles


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_eight_threads_first_calls_compile_each_kernel_once_and_are_correct(tmp_path, monkeypatch, dtype):
    # A fresh kernel cache and Triton cache: every kernel these calls need is compiled here.
    monkeypatch.setenv("FA2GEN_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    clear_memo()
    # eight new shapes of one bucket (one kernel) and a GQA one beside them
    shapes = [(2, 4, 4, 1000 + 37 * i, 1000 + 37 * i, 128) for i in range(6)] + [(1, 8, 2, 777, 1777, 128)] * 2
    inputs, results, compiles = _first_calls_at_once(shapes, dtype, causal=True)
    for i, (result, (q, k, v)) in enumerate(zip(results, inputs)):
        assert not isinstance(result, Exception), f"thread {i}: {result!r}"
        verdict = check_forward(q, k, v, make_problem(q, k, v, causal=True), *result)
        assert verdict.ok, f"thread {i} {shapes[i]}: {verdict}"
    assert compiles, "no kernel was compiled: the hook saw nothing"
    twice = {key: n for key, n in compiles.items() if n > 1}
    assert not twice, f"compiled more than once: {twice}"


_CHILD = """
import json, sys, torch, fa2gen
from fa2gen.bench.correctness import check_forward
from fa2gen.runtime.problem import make_problem
g = torch.Generator(device="cpu").manual_seed(int(sys.argv[1]))
q, k, v = (torch.randn(2, 4, 1531, 96, generator=g).half().cuda() for _ in range(3))
out, lse = fa2gen.attention(q, k, v, causal=True, return_lse=True)
print(json.dumps(str(check_forward(q, k, v, make_problem(q, k, v, causal=True), out, lse).ok)))
"""


@pytest.mark.gpu
def test_two_processes_first_calls_through_one_kernel_cache(tmp_path):
    # Both render, write and import the same new module and compile its kernel into one
    # Triton cache at once; both must get correct results.
    env = {**os.environ, "FA2GEN_CACHE_DIR": str(tmp_path / "kernels"), "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    env.pop("TRITON_INTERPRET", None)
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    children = [subprocess.Popen([sys.executable, "-c", _CHILD, str(i)], env=env, **pipes) for i in (0, 1)]
    for child in children:
        out, err = child.communicate(timeout=600)
        assert child.returncode == 0, err.decode()[-3000:]
        assert out.decode().strip().splitlines()[-1] == '"True"'
    modules = list((tmp_path / "kernels").glob("*.py"))
    assert modules and not list((tmp_path / "kernels").glob(".*.tmp"))
    for m in modules:
        compile(m.read_text(), str(m), "exec")
