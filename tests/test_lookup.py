"""Run-time lookup precedence: user DB, shipped YAML (device, then arch), default."""

import dataclasses

import pytest
import torch
import triton

from fa2gen.generator.spec import TuningParams
from fa2gen.runtime import lookup
from fa2gen.runtime.defaults import default_params
from fa2gen.runtime.device import DeviceInfo
from fa2gen.runtime.dispatch import clear_memo, explain
from fa2gen.runtime.problem import make_problem
from fa2gen.store import shipped
from fa2gen.store.buckets import Bucket
from fa2gen.store.db import TunedDB
from fa2gen.store.records import Entry, Measurement, Validity
from fa2gen.store.yamlfile import dump

H200 = DeviceInfo("NVIDIA_H200", (9, 0), "sm90", 132)
H100 = "NVIDIA_H100_80GB_HBM3"
P_DB = TuningParams(64, 64, 4, 3, "pointer")
P_DEV = TuningParams(128, 32, 4, 2, "tma_device")
P_ARCH = TuningParams(64, 32, 4, 2, "tma_host")


def problem(n=4096, nk=None, bh=(4, 16)):
    q = torch.empty(bh[0], bh[1], n, 128, dtype=torch.float16, device="meta")
    k = torch.empty(bh[0], bh[1], nk or n, 128, dtype=torch.float16, device="meta")
    return make_problem(q, k, k, causal=True)


def validity(device="NVIDIA_H200", triton_version=None):
    return Validity(device, "9.0", triton_version or triton.__version__)


def entry(params, bucket, v, code=""):
    return Entry(v, bucket, params, Measurement(1.0, 0.99, 1.01, 500.0, 1e-3), default_ms=1.2, trials=10, code=code)


@pytest.fixture
def env(tmp_path, monkeypatch):
    root = tmp_path / "shipped"
    (root / "sm90").mkdir(parents=True)
    monkeypatch.setattr(shipped, "shipped_root", lambda: root)
    shipped.shipped_files.cache_clear()
    db_path = tmp_path / "user.sqlite"
    monkeypatch.setenv("FA2GEN_DB", str(db_path))
    clear_memo()
    yield root, db_path
    shipped.shipped_files.cache_clear()
    clear_memo()


def write_yaml(root, device, entries, name=None):
    (root / "sm90" / f"{name or device}.yaml").write_text(
        dump(entries, arch="sm90", fa2gen_version="0.1.0", torch_version="2.11.0")
    )
    shipped.shipped_files.cache_clear()  # shipped files are read once per process


def choose(p=None):
    clear_memo()
    return explain(p or problem(), H200)


def test_precedence(env):
    root, db_path = env
    b = Bucket.of(problem())
    assert choose().source == "default"
    assert choose().params == default_params(problem().kernel_spec(), "sm90", b.seqlen_q)
    write_yaml(root, H100, [entry(P_ARCH, b, validity(H100))])
    assert (choose().source, choose().params) == ("shipped-arch", P_ARCH)
    write_yaml(root, "NVIDIA_H200", [entry(P_DEV, b, validity())])
    assert (choose().source, choose().params) == ("shipped", P_DEV)
    TunedDB(db_path).put([entry(P_DB, b, validity())])
    assert (choose().source, choose().params) == ("db", P_DB)


def test_host_bound_calls_default_to_pointer_loads(env):
    """A call whose GPU time is a few microseconds takes pointer loads, not host descriptors
    (their building costs the host more than the GPU saves); one that reads many bytes with few
    FLOPs (one query token over a long cache) is not host-bound and keeps them."""
    tiny = choose(problem(128, bh=(1, 8)))
    assert tiny.source == "default" and tiny.params.loads == "pointer"
    assert tiny.params == default_params(problem(128, bh=(1, 8)).kernel_spec(), "sm90", 128).replace(loads="pointer")
    for shape in (dict(n=4096), dict(n=1, nk=8192, bh=(2, 32)), dict(n=512, bh=(2, 16))):
        assert choose(problem(**shape)).params.loads == "tma_host", shape
    backward = explain(problem(128, bh=(1, 8)), H200, "bwd").params
    assert backward.loads == "pointer"


def test_nearest_bucket_and_distance_limit(env):
    root, db_path = env
    TunedDB(db_path).put([entry(P_DB, Bucket.of(problem(8192, bh=(2, 16))), validity())])
    c = choose(problem(4096, bh=(4, 16)))
    assert (c.source, c.params) == ("db-nearest", P_DB) and c.bucket.seqlen_q == 8192
    far = choose(problem(128, bh=(256, 16)))  # 6 doublings in each length, 4 in batch*heads
    assert far.source == "default"


def test_the_other_16_bit_dtype_answers_before_the_default(env):
    """fp16 and bf16 share kernel code: an fp16 call with no fp16 entry takes the bf16 entry of
    its own shape, ahead of an fp16 neighbour a doubling away and behind an fp16 exact entry;
    fp8 has no sibling."""
    root, db_path = env
    b = Bucket.of(problem())
    assert b.dtype == "fp16"
    twin = dataclasses.replace(b, dtype="bf16")
    db = TunedDB(db_path)
    db.put([entry(P_DB, twin, validity())])
    c = choose()
    assert (c.source, c.params, c.bucket) == ("db-nearest", P_DB, twin)
    neighbour = Bucket.of(problem(bh=(8, 16)))  # batch x heads doubled
    assert b.gap(twin) == 0.5 and b.gap(neighbour) == 1.0
    db.put([entry(P_ARCH, neighbour, validity())])
    assert choose().params == P_DB  # the sibling's own shape before an fp16 bucket a doubling away
    assert choose(problem(bh=(16, 16))).params == P_ARCH  # ... which is nearer for twice that
    db.put([entry(P_DEV, b, validity())])
    assert (choose().source, choose().params) == ("db", P_DEV)
    fp8 = Bucket("fwd", "fp8e4m3", 128, "causal", False, 1, 4096, 4096, 64)
    assert fp8.gap(dataclasses.replace(fp8, dtype="bf16")) is None and twin.gap(fp8) is None


def test_stale_entries_are_skipped(env, caplog):
    root, db_path = env
    b = Bucket.of(problem())
    TunedDB(db_path).put([entry(P_DB, b, validity(triton_version="2.9.9"))])
    write_yaml(root, "NVIDIA_H200", [entry(P_DEV, b, validity(), code="ffffffffffffffff")])
    import logging

    with caplog.at_level(logging.DEBUG, logger="fa2gen"):
        assert choose().source == "default"
    assert "another Triton" in caplog.text


@pytest.mark.parametrize(
    "installed,tuned",
    [
        ("3.6.0", "3.6.0"),
        ("3.7.1", "3.6.0"),
        ("3.8.0", "3.9.0"),
        ("3.9.0", "3.9.0"),
        ("3.10.0", "3.9.0"),
        ("3.5.1", "3.6.0"),
    ],
)
def test_a_triton_without_shipped_entries_takes_the_nearest_versions(env, monkeypatch, installed, tuned):
    root, _ = env
    b = Bucket.of(problem())
    params = {"3.6.0": P_DEV, "3.9.0": P_ARCH}
    for version, p in params.items():
        write_yaml(root, "NVIDIA_H200", [entry(p, b, validity(triton_version=version))], name=f"H200-{version}")
    # another device's file of the installed version does not outrank this device's own
    write_yaml(root, H100, [entry(P_DB, b, validity(H100, triton_version=installed))])
    monkeypatch.setattr(triton, "__version__", installed)
    c = choose()
    assert (c.source, c.params, c.triton) == ("shipped", params[tuned], tuned)


def test_files_answer_in_order_of_their_triton_version():
    from types import SimpleNamespace

    files = [SimpleNamespace(meta={"triton": v}) for v in ("3.6.0", "3.8.0", "3.7.1", "3.7.0")]
    pick = lambda installed: [f.meta["triton"] for f in lookup.by_triton(files, installed)]  # noqa: E731
    assert pick("3.7.0") == ["3.7.0", "3.7.1", "3.6.0", "3.8.0"]
    assert pick("3.7.2") == ["3.7.1", "3.7.0", "3.6.0", "3.8.0"]  # the same minor version, either patch
    assert pick("3.9.0") == ["3.8.0", "3.7.1", "3.7.0", "3.6.0"] and pick("3.5.0")[0] == "3.6.0"
    assert pick("3.7.5")[2:] == ["3.6.0", "3.8.0"]  # 3.6 and 3.8 tie: the older first
    assert lookup.by_triton([], "3.9.0") == []


def test_an_exact_bucket_anywhere_before_a_nearest_one(env, monkeypatch):
    """This device's file answers an exact bucket under any Triton version, then a sibling
    GPU's file does; only then a nearest bucket, this device's files first, the installed
    version's first."""
    root, _ = env
    monkeypatch.setattr(triton, "__version__", "3.9.0")
    b = Bucket.of(problem())
    near = Bucket.of(problem(bh=(8, 16)))
    other = Bucket.of(problem(n=1024))
    write_yaml(
        root,
        "NVIDIA_H200",
        [entry(P_DB, near, validity(triton_version="3.9.0")), entry(P_ARCH, other, validity(triton_version="3.9.0"))],
        name="H200-3.9",
    )
    write_yaml(root, H100, [entry(P_DEV, b, validity(H100, triton_version="3.9.0"))])
    c = choose()
    assert (c.source, c.params, c.bucket) == ("shipped-arch", P_DEV, b)
    write_yaml(root, "NVIDIA_H200", [entry(P_ARCH, b, validity(triton_version="3.6.0"))], name="H200-3.6")
    c = choose()
    assert (c.source, c.params, c.triton) == ("shipped", P_ARCH, "3.6.0")
    c = choose(problem(bh=(2, 16)))
    assert (c.source, c.params, c.bucket) == ("shipped-nearest", P_DB, near)  # the installed version's file first
    c = choose(problem(n=1024))
    assert (c.source, c.params) == ("shipped", P_ARCH)


def test_corrupted_files_warn_and_fall_back(env):
    root, db_path = env
    b = Bucket.of(problem())
    db_path.write_bytes(b"\x00garbage" * 1000)
    write_yaml(root, H100, [entry(P_ARCH, b, validity(H100))])
    (root / "sm90" / "NVIDIA_H200.yaml").write_text("entries: [unterminated")
    shipped.shipped_files.cache_clear()
    lookup._warned.clear()
    with pytest.warns(RuntimeWarning) as record:
        c = choose()
    assert (c.source, c.params) == ("shipped-arch", P_ARCH)
    messages = " ".join(str(w.message) for w in record)
    assert "tuned database" in messages and "NVIDIA_H200.yaml" in messages


def test_misfiled_yaml_is_ignored(env):
    root, _ = env
    b = Bucket.of(problem())
    text = dump([entry(P_ARCH, b, validity())], arch="sm86", fa2gen_version="0.1.0", torch_version="x")
    (root / "sm90" / "NVIDIA_H200.yaml").write_text(text)
    shipped.shipped_files.cache_clear()
    with pytest.warns(RuntimeWarning, match="arch: sm86 disagrees with capability 9.0"):
        assert choose().source == "default"


def test_disable_tuned(env, monkeypatch):
    root, db_path = env
    TunedDB(db_path).put([entry(P_DB, Bucket.of(problem()), validity())])
    assert choose().source == "db"
    monkeypatch.setenv("FA2GEN_DISABLE_TUNED", "1")
    assert choose().source == "default"


def test_lookup_never_creates_a_database(env):
    _, db_path = env
    choose()
    assert not db_path.exists()


def test_params_that_do_not_fit_are_skipped(env):
    _, db_path = env
    b = Bucket.of(problem())
    huge = TuningParams(256, 256, 8, 4, "tma_host")  # far over sm90's shared memory at D=128
    TunedDB(db_path).put([entry(huge, b, validity())])
    assert choose().source == "default"


def test_gluon_entries_serve_hopper_only(env):
    """A newer GPU shares sm90's configs, but the Gluon forward issues Hopper's wgmma: such a
    GPU gets the default where the tuned entry is a Gluon one."""
    root, _ = env
    b = Bucket.of(problem())
    gluon = TuningParams(128, 128, 8, 2, "tma_host", gluon=2)
    write_yaml(root, "NVIDIA_H200", [entry(gluon, b, validity())])
    assert (choose().source, choose().params) == ("shipped", gluon)
    blackwell = DeviceInfo("NVIDIA_B200", (10, 0), "sm90", 148)
    clear_memo()
    c = explain(problem(), blackwell)
    assert c.source == "default" and c.params.gluon == 0


def test_every_shipped_entry_renders_to_the_code_it_was_tuned_on():
    # A template change that alters a shipped variant's code stales that entry (dispatch skips
    # it): such a change lands together with the entry's re-tune, never before. Comment edits
    # stale nothing (test_spec.py).
    from pathlib import Path

    from fa2gen.store.yamlfile import read

    files = sorted((Path(__file__).resolve().parents[1] / "tuned_configs").glob("*/*.yaml"))
    assert files
    for path in files:
        config = read(path)
        assert config.meta["schema"] == 2 and config.entries, path
        stale = [e.bucket.key for e in config.entries if not e.current]
        assert not stale, (path.name, stale)


def test_an_exact_shipped_bucket_beats_the_databases_nearest_one(env):
    """A partial tune (buckets at 2k and 8k tokens) took the 1k and 4k buckets from its own
    nearest entries, dropping the shipped file's exact ones for them. An exact bucket from any
    source now comes first; among exact ones the database, then this device's file, then the
    arch's."""
    root, db_path = env
    here, near = problem(4096), problem(8192, bh=(2, 16))
    write_yaml(root, H100, [entry(P_ARCH, Bucket.of(here), validity(H100))])
    TunedDB(db_path).put([entry(P_DB, Bucket.of(near), validity())])
    assert (choose(here).source, choose(here).params) == ("shipped-arch", P_ARCH)
    write_yaml(root, "NVIDIA_H200", [entry(P_DEV, Bucket.of(here), validity())])
    assert (choose(here).source, choose(here).params) == ("shipped", P_DEV)
    TunedDB(db_path).put([entry(P_DB, Bucket.of(here), validity())])
    assert (choose(here).source, choose(here).params) == ("db", P_DB)
    # with no exact entry anywhere, the database's nearest answers before the shipped nearest
    other = problem(2048, bh=(8, 16))
    assert choose(other).source == "db-nearest"
