import os
import threading

from fa2gen.generator import cache
from fa2gen.generator.cache import load_module, module_path, write_module
from fa2gen.generator.identity import Variant
from fa2gen.generator.rendering import render
from fa2gen.generator.spec import KernelSpec, TuningParams


def test_cache_dir_override_and_content_addressing(tmp_path, monkeypatch):
    monkeypatch.setenv("FA2GEN_CACHE_DIR", str(tmp_path))
    v = Variant(KernelSpec(head_dim=48), TuningParams())
    path = write_module(v)
    assert path == tmp_path / f"{v.name}.py"
    assert path.read_text() == render(v.spec, v.params, name=v.name)
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".tmp"]


def test_corrupted_file_is_rewritten(tmp_path, monkeypatch):
    monkeypatch.setenv("FA2GEN_CACHE_DIR", str(tmp_path))
    v = Variant(KernelSpec(head_dim=56), TuningParams())
    path = write_module(v)
    path.write_text("raise SystemExit('truncated')")
    write_module(v)
    assert path.read_text() == render(v.spec, v.params, name=v.name)


def test_unchanged_file_is_not_rewritten(tmp_path, monkeypatch):
    monkeypatch.setenv("FA2GEN_CACHE_DIR", str(tmp_path))
    v = Variant(KernelSpec(head_dim=104), TuningParams())
    path = write_module(v)
    os.utime(path, (1, 1))
    write_module(v)
    assert path.stat().st_mtime == 1


def test_load_module_memoises_and_exposes_kernel(tmp_path, monkeypatch):
    monkeypatch.setenv("FA2GEN_CACHE_DIR", str(tmp_path))
    spec, params = KernelSpec(head_dim=120, mask="causal"), TuningParams(block_m=32)
    mods = []
    threads = [threading.Thread(target=lambda: mods.append(load_module(spec, params))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(m) for m in mods}) == 1
    mod = mods[0]
    assert mod.NAME == Variant(spec, params).name
    assert mod.SPEC == spec.to_dict() and mod.LOADS == "pointer"
    assert callable(getattr(mod.attn_fwd, "__getitem__", None))
    assert module_path(Variant(spec, params)).exists()
    key = (spec, params, cache.interpreting())
    assert cache._modules[key] is mod
