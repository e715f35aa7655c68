"""Results database and tuned-config YAML: round trips and hostile input."""

import sqlite3

import pytest
import yaml

from fa2gen.generator.spec import TuningParams
from fa2gen.store.buckets import Bucket
from fa2gen.store.db import StoreError, TunedDB
from fa2gen.store.records import SCHEMA_VERSION, Entry, Measurement, RecordError, Validity
from fa2gen.store.yamlfile import dump, parse

VALID = Validity("NVIDIA_H200", "9.0", "3.6.0")
B = Bucket("fwd", "bf16", 80, "local", True, 4, 1024, 8192, 256)


def entry(ms=1.0, params=TuningParams(128, 64, 4, 2, "tma_host"), bucket=B, validity=VALID, default_ms=1.5):
    return Entry(
        validity,
        bucket,
        params,
        Measurement(ms, ms * 0.98, ms * 1.03, 400.0, 1e-3),
        default_ms=default_ms,
        trials=17,
        created_at="2026-11-29T00:00:00+00:00",
    )


def test_bucket_keys_round_trip_and_reject_garbage():
    assert Bucket.parse(B.key) == B
    for bad in (
        "fwd/fp16/d64",
        "fwd/fp16/d64/none/sc0/g3/q64/k64/bh64",
        "fwd/fp16/d64/none/sc0/g1/q64/k64/bh64;x",
        "rev/fp16/d64/none/sc0/g1/q64/k64/bh64",
        42,
    ):
        with pytest.raises(ValueError):
            Bucket.parse(bad)
    backward = "bwd/bf16/d128/causal/sc0/g4/q2048/k2048/bh64"
    assert Bucket.parse(backward).key == backward and Bucket.parse(backward).kernel_spec().direction == "bwd"


def test_db_round_trip_keeps_the_faster_entry(tmp_path):
    db = TunedDB(tmp_path / "t.sqlite")
    assert db.schema_version() == SCHEMA_VERSION == 2
    db.put([entry(ms=2.0)])
    db.put([entry(ms=1.0, params=TuningParams(64, 64, 4, 3, "pointer"))])
    db.put([entry(ms=3.0, params=TuningParams(32, 32, 4, 1, "pointer"))])  # slower: ignored
    got = db.get(VALID, B)
    assert got.params == TuningParams(64, 64, 4, 3, "pointer") and got.measurement.median_ms == 1.0
    assert got.speedup == pytest.approx(1.5)
    assert db.get(Validity("NVIDIA_H200", "9.0", "3.7.0"), B) is None
    assert db.count_stale(Validity("NVIDIA_H200", "9.0", "3.7.0")) == 1
    assert len(list(TunedDB(tmp_path / "t.sqlite").entries())) == 1


def test_db_put_superseding_takes_a_slower_entry_while_the_row_is_unchanged(tmp_path):
    """A study that timed the stored entry beside its own winner replaces it, slower time or
    not; if another writer changed the row meanwhile, only a faster entry replaces that."""
    db = TunedDB(tmp_path / "t.sqlite")
    db.put([entry(ms=1.0)])
    held = db.get(VALID, B)
    slower = TuningParams(64, 64, 4, 3, "pointer")
    db.put([entry(ms=1.2, params=slower)])
    assert db.get(VALID, B) == held
    db.put([entry(ms=1.2, params=slower)], superseding=held)
    got = db.get(VALID, B)
    assert got.params == slower and got.measurement.median_ms == 1.2
    assert len(list(db.entries())) == 1
    other = TuningParams(32, 32, 4, 1, "pointer")
    db.put([entry(ms=1.3, params=other)], superseding=held)  # the row is no longer `held`
    assert db.get(VALID, B).params == slower
    with pytest.raises(ValueError, match="superseding"):
        db.put(
            [entry(ms=1.3, params=other), entry(ms=1.3, bucket=Bucket.parse(B.key.replace("q1024", "q512")))],
            superseding=held,
        )


def test_db_skips_tampered_rows(tmp_path, caplog):
    path = tmp_path / "t.sqlite"
    TunedDB(path).put([entry(), entry(bucket=Bucket("fwd", "fp16", 64, "none", False, 1, 64, 64, 1))])
    con = sqlite3.connect(path)
    con.execute("UPDATE tuned SET params = ? WHERE bucket = ?", ('{"block_m": "__import__(\'os\')"}', B.key))
    con.commit()
    con.close()
    assert [e.bucket.head_dim for e in TunedDB(path).entries()] == [64]
    assert "skipping invalid row" in caplog.text
    # an emptied code digest is refused, not taken for today's (which would make the row valid)
    con = sqlite3.connect(path)
    con.execute("UPDATE tuned SET code = ''")
    con.commit()
    con.close()
    assert list(TunedDB(path).entries()) == []


def test_db_refuses_newer_schema_and_non_databases(tmp_path):
    path = tmp_path / "t.sqlite"
    TunedDB(path)
    con = sqlite3.connect(path)
    con.execute("UPDATE schema_version SET version = 99")
    con.commit()
    con.close()
    with pytest.raises(StoreError, match="newer"):
        TunedDB(path)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError):
        TunedDB(junk)


def test_yaml_round_trip():
    entries = [
        entry(),
        entry(bucket=Bucket("fwd", "fp16", 64, "causal", False, 1, 512, 512, 1024), default_ms=None),
        entry(
            bucket=Bucket("bwd", "bf16", 128, "none", False, 1, 4096, 4096, 64),
            params=TuningParams(128, 32, 8, 3, "pointer", "atomic"),
        ),
    ]
    text = dump(entries, arch="sm90", fa2gen_version="0.1.0", torch_version="2.11.0")
    cfg = parse(text)
    assert cfg.arch == "sm90" and cfg.meta["device"] == "NVIDIA_H200"
    assert sorted(cfg.entries, key=lambda e: e.bucket.key) == sorted(entries, key=lambda e: e.bucket.key)


def _doc(**changes):
    doc = yaml.safe_load(dump([entry()], arch="sm90", fa2gen_version="0.1.0", torch_version="2.11.0"))
    for k, v in changes.items():
        if k.startswith("entry_"):
            doc["entries"][0][k[6:]] = v
        else:
            doc[k] = v
    return yaml.safe_dump(doc)


def _params(**changes):
    # a valid forward entry's params, but for ``changes``
    return {"block_m": 128, "block_n": 64, "num_warps": 4, "num_stages": 2, "loads": "pointer", **changes}


@pytest.mark.parametrize(
    "text,match",
    [
        ("!!python/object/apply:os.system ['echo pwned']", "not valid YAML"),
        ("a: &x [1]\nb: *x\n", "aliases"),
        ("- 1\n- 2\n", "mapping"),
        (_doc(extra=1), "unknown keys"),
        (_doc(schema=3), "schema"),
        (_doc(arch="sm100"), "arch"),
        (_doc(arch="sm80"), "arch: sm80 disagrees with capability 9.0"),  # (was accepted)
        (_doc(device="NVIDIA H200; rm -rf"), "device"),
        (_doc(capability=9.0), "capability"),
        (_doc(template_hash={"fwd": "{{ evil }}"}), "template_hash"),
        (_doc(entry_bucket="fwd/fp16/d64/none/sc0/g1/q64/k64/bh64\nimport os"), "bucket"),
        (_doc(entry_params=_params(loads="tma_host\nimport os")), "loads"),
        (_doc(entry_params=_params(block_m=100)), "block_m"),
        (_doc(entry_params=_params(extra=1)), "unknown"),
        (_doc(entry_params=_params(dq_mode="atomic\nimport os")), "dq_mode"),
        # a backward knob on a forward bucket: would not render, so it is not data we accept
        (_doc(entry_params=_params(dq_mode="atomic")), "backward knob"),
        (_doc(entry_median_ms=float("nan")), "median_ms"),
        (_doc(entry_median_ms=-1.0), "median_ms"),
        (_doc(entry_trials=True), "trials"),
        # 10**30 passed validation, then overflowed SQLite's 64-bit integers on import
        (_doc(entry_trials=10**30), "trials"),
        (_doc(entry_p20_ms=5.0), "p20_ms <= median_ms <= p80_ms"),
        (_doc(entry_p80_ms=0.5), "p20_ms <= median_ms <= p80_ms"),
        (_doc(entry_shell="ls"), "unknown keys"),
        # a repeated key was accepted, the last one winning
        (_doc().replace("schema: 2", "schema: 2\nschema: 2"), "appears twice"),
        (_doc().replace("    block_m: 128", "    block_m: 128\n    block_m: 64"), "appears twice"),
    ],
)
def test_yaml_rejects_hostile_or_invalid(text, match):
    with pytest.raises(RecordError, match=match):
        parse(text)


def test_a_file_with_two_entries_for_one_bucket_is_refused():
    """import said "imported 3" for three entries of which two shared a bucket, and stored 2."""
    text = dump([entry(), entry(ms=2.0, validity=VALID)], arch="sm90", fa2gen_version="0.1.0", torch_version="2.11.0")
    with pytest.raises(RecordError, match=r"entries\[0\] and entries\[1\] are both for bucket"):
        parse(text)


def test_yaml_rejects_huge_files():
    with pytest.raises(RecordError, match="larger"):
        parse("a: " + "x" * (9 * 1024 * 1024))


def test_readonly_reader_is_not_blocked_by_a_writer(tmp_path):
    path = tmp_path / "t.sqlite"
    TunedDB(path).put([entry()])
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # a tuner in the middle of a write
    writer.execute("DELETE FROM tuned")
    try:
        reader = TunedDB(path, readonly=True)
        t0 = __import__("time").time()
        assert reader.get(VALID, B) is not None  # WAL: readers see the last commit, without waiting
        assert __import__("time").time() - t0 < 5
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    with pytest.raises(StoreError):
        TunedDB(tmp_path / "missing.sqlite", readonly=True)


def _read_as_another_user(folder, code: str):
    """Run ``code`` in Python as a user who cannot write ``folder`` (its mode 0555): this
    process where it is not root, else (root writes anywhere) inside a user namespace whose
    user is not root. None where neither is possible."""
    import os
    import subprocess
    import sys

    folder.chmod(0o555)
    command = [sys.executable, "-c", code]
    if os.geteuid() == 0:
        probe = subprocess.run(["unshare", "-U", "--map-user=1000", "true"], capture_output=True)
        if probe.returncode != 0:
            return None
        command = ["unshare", "-U", "--map-user=1000", *command]
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=120)
    finally:
        folder.chmod(0o755)


def _closed_wal_database(tmp_path):
    """A folder holding t.sqlite with one entry, its writer closed: the log folded into the
    file, the -shm file removed."""
    shared = tmp_path / "shared"
    shared.mkdir()
    writer = TunedDB(shared / "t.sqlite")
    writer.put([entry()])
    writer.dispose()
    return shared


def test_a_wal_database_in_a_folder_the_reader_cannot_write_is_read(tmp_path):
    # A shared database tuned by an admin: WAL mode, no -shm beside it (its last writer
    # closed cleanly), in a folder others cannot write. SQLite's read-only open needs to
    # create the -shm file there, and failed: every entry was dropped with one warning.
    shared = _closed_wal_database(tmp_path)
    assert sorted(p.name for p in shared.iterdir()) == ["t.sqlite"]
    before = (shared / "t.sqlite").read_bytes()
    code = (
        "from fa2gen.store.db import TunedDB; from fa2gen.store.records import Validity; "
        f"from fa2gen.store.buckets import Bucket; db = TunedDB({str(shared / 't.sqlite')!r}, readonly=True); "
        f"print(db.get(Validity('NVIDIA_H200', '9.0', '3.6.0'), Bucket.parse({B.key!r})).params.label())"
    )
    done = _read_as_another_user(shared, code)
    if done is None:
        pytest.skip("needs a user that cannot write the folder (unshare -U refused as root)")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == TuningParams(128, 64, 4, 2, "tma_host").label()
    assert (shared / "t.sqlite").read_bytes() == before
    assert sorted(p.name for p in shared.iterdir()) == ["t.sqlite"]


def test_a_wal_database_with_pages_waiting_in_its_log_is_refused_in_one_line(tmp_path):
    shared = _closed_wal_database(tmp_path)
    (shared / "t.sqlite-wal").write_bytes(b"\0" * 4096)  # pages the file does not hold yet
    code = (
        "from fa2gen.store.db import TunedDB, StoreError\n"
        f"try:\n    TunedDB({str(shared / 't.sqlite')!r}, readonly=True)\n"
        "except StoreError as e:\n    print('refused:', e)"
    )
    done = _read_as_another_user(shared, code)
    if done is None:
        pytest.skip("needs a user that cannot write the folder (unshare -U refused as root)")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("refused:") and "wal_checkpoint" in done.stdout, done.stdout


@pytest.mark.parametrize(
    "text,match",
    [
        (_doc(arch=["sm90"]), "arch"),
        (_doc(entry_median_ms=10**400), "median_ms"),
        (_doc(entry_median_ms=0), "median_ms"),
        (_doc(triton="3.6.0\n"), "triton"),
        ("[" * 5000 + "]" * 5000, "mapping|invalid file|not valid YAML"),
    ],
    ids=["arch-list", "huge-int", "zero-time", "newline", "deep-nesting"],
)
def test_yaml_rejects_pathological_values(text, match):
    with pytest.raises(RecordError, match=match):
        parse(text)


def test_db_rows_with_pathological_json_are_skipped(tmp_path):
    path = tmp_path / "t.sqlite"
    TunedDB(path).put([entry()])
    con = sqlite3.connect(path)
    con.execute("UPDATE tuned SET params = ?", ("[" * 100000 + "]" * 100000,))
    con.commit()
    con.close()
    assert list(TunedDB(path, readonly=True).entries()) == []


def test_db_paths_with_url_characters(tmp_path):
    odd = tmp_path / "we%ird#dir?x" / "t.sqlite"
    TunedDB(odd).put([entry()])
    assert TunedDB(odd, readonly=True).get(VALID, B) is not None


def _v1_row(bucket, params, template_hash_, median_ms, created="2026-11-01T00:00:00+00:00"):
    import json

    return (
        "NVIDIA_H200",
        "9.0",
        "3.6.0",
        template_hash_,
        1,
        bucket.key,
        json.dumps(params.to_dict()),
        median_ms,
        median_ms,
        median_ms,
        100.0,
        None,
        None,
        0.0,
        3,
        created,
    )


def test_a_schema_1_database_is_upgraded_to_per_variant_validity(tmp_path):
    """Opening a v1 database (rows keyed by a hash of all of a direction's templates) for
    writing upgrades it: a row tuned on today's templates gets today's digest of its own
    variant and stays valid; one of an older template keeps its old hash and is stale; of
    two rows of one bucket the valid one is kept. A read-only open refuses to upgrade."""
    from fa2gen.generator.rendering import template_hash

    path = tmp_path / "v1.sqlite"
    con = sqlite3.connect(path)
    con.executescript(
        """
        CREATE TABLE schema_version (version INTEGER PRIMARY KEY);
        INSERT INTO schema_version VALUES (1);
        CREATE TABLE tuned (id INTEGER PRIMARY KEY AUTOINCREMENT, device VARCHAR(64), capability VARCHAR(8),
            triton VARCHAR(64), template_hash VARCHAR(16), schema INTEGER, bucket VARCHAR(128), params TEXT,
            median_ms FLOAT, p20_ms FLOAT, p80_ms FLOAT, tflops FLOAT, default_ms FLOAT, speedup FLOAT,
            max_error FLOAT, trials INTEGER, created_at VARCHAR(64),
            UNIQUE (device, capability, triton, template_hash, schema, bucket));
        """
    )
    today, old = template_hash("fwd"), "0123456789abcdef"
    b1 = Bucket("fwd", "fp16", 128, "causal", False, 1, 4096, 4096, 64)
    b2 = Bucket("fwd", "fp16", 128, "none", False, 1, 4096, 4096, 64)
    p, q = TuningParams(128, 64, 4, 2, "tma_host"), TuningParams(64, 64, 4, 2, "tma_host")
    rows = [_v1_row(b1, p, today, 2.0), _v1_row(b1, q, old, 1.0), _v1_row(b2, q, old, 1.0)]
    con.executemany(f"INSERT INTO tuned VALUES (NULL, {', '.join('?' * 16)})", rows)
    con.commit()
    con.close()
    with pytest.raises(StoreError, match="fa2gen import"):
        TunedDB(path, readonly=True)
    db = TunedDB(path)
    assert db.schema_version() == SCHEMA_VERSION
    got = {e.bucket: e for e in db.entries()}
    assert set(got) == {b1, b2}
    assert got[b1].params == p and got[b1].current and got[b1].measurement.median_ms == 2.0
    assert got[b2].code == old and not got[b2].current
    assert db.get(VALID, b1) == got[b1] and db.get(VALID, b2) is None
    assert db.count_stale(VALID) == 1


def test_a_stale_row_is_replaced_by_any_new_result():
    """A row whose code changed compares with nothing: a slower result on today's code
    replaces it; a slower one does not replace a valid row."""
    import tempfile
    from pathlib import Path

    db = TunedDB(Path(tempfile.mkdtemp()) / "t.sqlite")
    stale = Entry(
        VALID,
        B,
        TuningParams(128, 64, 4, 2, "tma_host"),
        Measurement(1.0, 0.9, 1.1, 400.0, 0.0),
        code="ffffffffffffffff",
    )
    db.put([stale])
    assert db.get(VALID, B) is None and db.count_stale(VALID) == 1
    db.put([entry(ms=3.0)])
    assert db.get(VALID, B).measurement.median_ms == 3.0 and db.count_stale(VALID) == 0
    db.put([entry(ms=4.0)])
    assert db.get(VALID, B).measurement.median_ms == 3.0


def test_schema_1_files_read_as_current_or_stale_by_their_template_hash():
    from fa2gen.generator.rendering import template_hash

    doc = yaml.safe_load(dump([entry()], arch="sm90", fa2gen_version="0.1.0", torch_version="2.11.0"))
    del doc["entries"][0]["code"]
    doc["schema"] = 1
    doc["template_hash"] = {"fwd": template_hash("fwd")}
    [e] = parse(yaml.safe_dump(doc)).entries
    assert e.current and e.code == entry().code
    doc["template_hash"] = {"fwd": "0123456789abcdef"}
    [e] = parse(yaml.safe_dump(doc)).entries
    assert not e.current and e.code == "0123456789abcdef"
    doc["entries"][0]["code"] = entry().code  # schema 1 has no per-entry code
    with pytest.raises(RecordError, match="unknown keys"):
        parse(yaml.safe_dump(doc))


def test_an_entry_is_judged_by_the_code_its_own_triton_renders():
    """The Gluon forward sums rows in chains from Triton 3.8 on (compat.sums_in_tree): an
    entry tuned under 3.6 stays valid beside one tuned under 3.9, each against the code its
    own version renders, and a digest claimed for the wrong version is stale."""
    from dataclasses import replace

    gluon = TuningParams(128, 128, 8, 3, "tma_host", gluon=2)
    bucket = Bucket.parse("fwd/bf16/d128/none/sc0/g1/q4096/k4096/bh64")
    old = entry(params=gluon, bucket=bucket)
    new = entry(params=gluon, bucket=bucket, validity=replace(VALID, triton="3.9.0"))
    assert old.current and new.current and old.code != new.code
    assert not replace(old, code=new.code).current and not replace(new, code=old.code).current
    # where no template differs between versions, neither does the digest
    plain = entry(bucket=bucket, params=TuningParams(128, 64, 4, 2, "tma_host"))
    assert plain.code == entry(bucket=bucket, params=plain.params, validity=replace(VALID, triton="3.9.0")).code


def test_every_shipped_entry_is_current():
    """A template edit that changes what a shipped entry's params render to (even its layout:
    the digest is of the normalised code) makes the entry stale, and attention() would drop it:
    a new feature's template branches must leave the plain variants' code as it was."""
    from fa2gen.store.shipped import shipped_files

    files = shipped_files("sm90")
    assert files
    stale = [e.bucket.key for _, cfg in files for e in cfg.entries if not e.current]
    assert not stale, f"{len(stale)} stale shipped entries, e.g. {stale[:3]}"


def test_thousands_of_entries_go_in_in_one_put(tmp_path):
    """One put of 3000 entries (what an import of a large file does): SQLite caps a statement's variables,
    and one INSERT of 16 columns a row overflowed the cap past 2047 rows, storing nothing."""
    from sqlalchemy import event

    many = [entry(validity=Validity(f"GPU_{i}", "9.0", "3.6.0")) for i in range(3000)]
    db = TunedDB(tmp_path / "t.sqlite")
    # the cap of a stock build (32766; some distributions raise it), whatever this one's is
    event.listen(db.engine, "connect", lambda conn, _: conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 32766))
    db.engine.dispose()
    assert db.put(many) == 3000
    assert len(list(db.entries())) == 3000
    assert db.get(Validity("GPU_2999", "9.0", "3.6.0"), B).params == many[0].params


def _run(code: str, timeout: float = 60.0):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)


def test_special_files_are_refused_never_read_without_end_or_waited_on(tmp_path):
    """The size cap read st_size, 0 for special files: /dev/zero was read until memory ran out,
    and a FIFO blocked forever, in `fa2gen import` and in the config lookup alike."""
    import os

    fifo = tmp_path / "configs" / "sm90" / "a.yaml"
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    (tmp_path / "big.yaml").write_text("a: " + "x" * (9 * 1024 * 1024))
    for path in (fifo, "/dev/zero", tmp_path / "big.yaml", tmp_path / "configs"):
        code = f"from fa2gen.store.yamlfile import read\ntry:\n    read({str(path)!r})\n"
        code += "except Exception as e:\n    print(e)"
        r = _run(code)  # (a hang fails here by its timeout)
        assert r.returncode == 0 and r.stdout.strip(), r.stderr
        assert "regular file" in r.stdout or "larger than" in r.stdout, r.stdout
    code = (
        "import warnings, pathlib\nfrom fa2gen.store.shipped import shipped_files\n"
        f"with warnings.catch_warnings(record=True) as w:\n    warnings.simplefilter('always')\n"
        f"    print(shipped_files('sm90', pathlib.Path({str(tmp_path / 'configs')!r})), len(w))"
    )
    r = _run(code)
    assert r.returncode == 0 and r.stdout.split() == ["()", "1"], r.stdout + r.stderr
    from typer.testing import CliRunner

    from fa2gen.cli import app

    r = CliRunner().invoke(app, ["import", "/dev/zero", "--db", str(tmp_path / "x.sqlite")])
    assert r.exit_code == 1 and "not a regular file" in r.output and len(r.output.strip().splitlines()) == 1


def test_one_bad_entry_costs_the_shipped_file_that_entry_not_the_file(tmp_path, recwarn):
    """A shipped file with one invalid entry was dropped whole, every good entry with it; import
    still refuses such a file outright."""
    from fa2gen.store.shipped import shipped_files

    other = Bucket("fwd", "fp16", 64, "causal", False, 1, 512, 512, 1024)
    doc = yaml.safe_load(
        dump([entry(), entry(bucket=other)], arch="sm90", fa2gen_version="0.1.0", torch_version="2.11.0")
    )
    doc["entries"][0]["params"]["block_m"] = 100
    (tmp_path / "sm90").mkdir()
    (tmp_path / "sm90" / "NVIDIA_H200.yaml").write_text(yaml.safe_dump(doc))
    [(device, cfg)] = shipped_files("sm90", tmp_path)
    assert [e.bucket for e in cfg.entries] == [other] and "block_m" in cfg.skipped[0]
    assert any("ignoring 1 invalid entries" in str(w.message) for w in recwarn)
    with pytest.raises(RecordError, match="block_m"):
        parse(yaml.safe_dump(doc))


# A writer process: puts one entry at a time, each for a device of its own, and prints its
# name once the put has returned (committed).
_WRITER = """
import sys
from fa2gen.generator.spec import TuningParams
from fa2gen.store.buckets import Bucket
from fa2gen.store.db import TunedDB
from fa2gen.store.records import Entry, Measurement, Validity
path, writer, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
db = TunedDB(path)
bucket = Bucket("fwd", "bf16", 128, "causal", False, 1, 1024, 1024, 256)
for i in range(count):
    device = f"W{writer}_{i}"
    m = Measurement(1.0, 0.98, 1.03, 400.0, 1e-3)
    db.put([Entry(Validity(device, "9.0", "3.6.0"), bucket, TuningParams(), m, default_ms=1.5, trials=3)])
    print(device, flush=True)
"""


def _writers(path, count, per_writer):
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(path), str(w), str(per_writer)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for w in range(count)
    ]


def _stored_devices(path) -> set[str]:
    con = sqlite3.connect(path)
    try:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return {r[0] for r in con.execute("SELECT device FROM tuned")}
    finally:
        con.close()


@pytest.mark.parametrize("writers", [4, 8])
def test_concurrent_writer_processes_lose_no_row_and_never_see_a_lock(tmp_path, writers):
    path = tmp_path / "t.sqlite"
    TunedDB(path).dispose()  # the schema, as a first run makes it
    procs = _writers(path, writers, 25)
    outputs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0 and "locked" not in err, err[-2000:]
    written = {line for out, _ in outputs for line in out.split()}
    assert len(written) == writers * 25
    assert _stored_devices(path) == written


def test_writers_killed_mid_write_lose_no_committed_row(tmp_path):
    # SIGKILL at arbitrary points of four writers, six times over: every put that returned
    # is in the file, and the file passes SQLite's integrity check.
    import random
    import signal
    import time

    path = tmp_path / "t.sqlite"
    TunedDB(path).dispose()
    rng = random.Random(0)
    committed, kills = set(), 0
    for round_ in range(6):
        procs = _writers(path, 4, 10_000)
        time.sleep(1.5 + rng.random())  # past their start-up, into their writes
        for p in procs:
            p.send_signal(signal.SIGKILL)
        for p in procs:
            out, _ = p.communicate(timeout=60)
            assert p.returncode == -signal.SIGKILL
            committed |= set(out.split())
            kills += 1
        stored = _stored_devices(path)
        assert committed <= stored, f"round {round_}: {len(committed - stored)} committed rows lost"
    assert kills == 24 and len(committed) > 24
