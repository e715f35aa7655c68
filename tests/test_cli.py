import ast
import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from fa2gen.cli import app

runner = CliRunner()


def test_generate_prints_parseable_source():
    r = runner.invoke(
        app,
        [
            "generate",
            "--head-dim",
            "96",
            "--mask",
            "local",
            "--softcap",
            "--loads",
            "tma_device",
            "--block-m",
            "128",
            "--num-stages",
            "3",
        ],
    )
    assert r.exit_code == 0, r.output
    tree = ast.parse(r.stdout)
    names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert {"attn_fwd", "_attend_blocks"} <= names
    assert "fa2gen_fwd_fp16_d96_local_softcap_m128_n64_w4_s3_tma_device_" in r.stdout


@pytest.mark.parametrize(
    "args,match",
    [
        (["--head-dim", "100"], "head_dim"),
        (["--block-m", "48"], "block_m"),
        (["--mask", "import os"], "mask"),
    ],
)
def test_generate_rejects_invalid(args, match):
    r = runner.invoke(app, ["generate", *args])
    assert r.exit_code == 2
    assert match in r.output


def test_generate_gluon_forward():
    r = runner.invoke(
        app,
        [
            "generate",
            "--head-dim",
            "128",
            "--mask",
            "causal",
            "--gluon",
            "2",
            "--block-m",
            "128",
            "--block-n",
            "128",
            "--num-warps",
            "8",
            "--loads",
            "tma_host",
        ],
    )
    assert r.exit_code == 0, r.output
    tree = ast.parse(r.stdout)
    assert "attn_fwd" in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert "gl.warp_specialize" in r.stdout and "_gluon2_" in r.stdout
    r = runner.invoke(app, ["generate", "--head-dim", "128", "--gluon", "2", "--block-m", "128", "--num-warps", "8"])
    assert r.exit_code == 2 and "tma_host" in r.output


def test_generate_to_file(tmp_path):
    out = tmp_path / "k.py"
    r = runner.invoke(app, ["generate", "-o", str(out)])
    assert r.exit_code == 0
    ast.parse(out.read_text())


def test_info_on_cpu():
    r = runner.invoke(app, ["info", "--seqlen-q", "5", "--head-dim", "80", "--causal", "--kv-heads", "4"])
    assert r.exit_code == 0, r.output
    assert "triton" in r.output and "kernel cache" in r.output
    assert "mask=causal" in r.output and "'block_m': 16" in r.output
    assert "backward config" in r.output and "'block_n': 16" in r.output.split("backward config")[1]


def test_info_rejects_bad_shape():
    r = runner.invoke(app, ["info", "--head-dim", "12"])
    assert r.exit_code == 2 and "head_dim" in r.output


@pytest.mark.interpreter
def test_bench_cpu_writes_json_and_markdown(tmp_path):
    js, md = tmp_path / "r.json", tmp_path / "r.md"
    r = runner.invoke(
        app,
        [
            "bench",
            "--shapes",
            "1,2,40,32;1,4,2,33,50,64",
            "--dtypes",
            "fp16",
            "--causal",
            "both",
            "--json",
            str(js),
            "--markdown",
            str(md),
        ],
    )
    assert r.exit_code == 0, r.output
    data = json.loads(js.read_text())
    assert len(data["results"]) == 4
    for row in data["results"]:
        assert row["tflops"]["fa2gen"] > 0
        square = row["case"]["seqlen_k"] in (None, row["case"]["seqlen"])
        if row["case"]["causal"] and not square:
            assert "top-left" in row["skipped"]["sdpa-math"]  # SDPA's causal differs off the square
        else:
            assert row["max_diff_vs_fa2gen"]["sdpa-math"] < 1e-2
    assert "fa2gen" in md.read_text()


def test_generate_backward():
    r = runner.invoke(
        app,
        [
            "generate",
            "--direction",
            "bwd",
            "--head-dim",
            "80",
            "--mask",
            "local",
            "--softcap",
            "--block-m",
            "128",
            "--block-n",
            "32",
        ],
    )
    assert r.exit_code == 0, r.output
    names = {n.name for n in ast.parse(r.output).body if isinstance(n, ast.FunctionDef)}
    assert {"attn_bwd_delta", "attn_bwd_dkdv", "attn_bwd_dq"} <= names
    assert runner.invoke(app, ["generate", "--direction", "bwd", "--loads", "tma_device"]).exit_code == 2
    assert (
        ".load([b, h, start_m, 0])"
        in runner.invoke(app, ["generate", "--direction", "bwd", "--loads", "tma_host"]).output
    )
    r = runner.invoke(app, ["generate", "--direction", "bwd", "--dq-mode", "atomic"])
    names = {n.name for n in ast.parse(r.output).body if isinstance(n, ast.FunctionDef)}
    assert "attn_bwd_dq_store" in names and "attn_bwd_dq" not in names and "tl.atomic_add(" in r.output
    assert runner.invoke(app, ["generate", "--dq-mode", "atomic"]).exit_code == 2  # a backward knob


@pytest.mark.parametrize("mode", ["bwd", "fwd+bwd"])
def test_bench_backward_modes_on_cpu(tmp_path, mode):
    js = tmp_path / "r.json"
    r = runner.invoke(
        app,
        [
            "bench",
            "--shapes",
            "1,4,2,33,50,32",
            "--dtypes",
            "fp16",
            "--causal",
            "off",
            "--mode",
            mode,
            "--json",
            str(js),
        ],
    )
    assert r.exit_code == 0, r.output
    (row,) = json.loads(js.read_text())["results"]
    assert row["mode"] == mode and row["tflops"]["fa2gen"] > 0
    assert row["max_diff_vs_fa2gen"]["sdpa-math"] < 2e-2  # dq, dk, dv against SDPA's math backend


def test_bench_rejects_bad_options():
    assert runner.invoke(app, ["bench", "--mode", "sideways"]).exit_code == 2
    assert runner.invoke(app, ["bench", "--shapes", "1,2,x,4"]).exit_code == 2
    assert runner.invoke(app, ["bench", "--providers", "cutlass"]).exit_code == 2
    assert runner.invoke(app, ["bench", "--causal", "maybe"]).exit_code == 2


def test_module_entry_point():
    r = subprocess.run([sys.executable, "-m", "fa2gen", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0
    for cmd in ("generate", "info", "bench"):
        assert cmd in r.stdout


def _db_with_entries(path, triton_version=None, code="", device="NVIDIA_H200", n=4096):
    import triton

    from fa2gen.generator.spec import TuningParams
    from fa2gen.store.buckets import Bucket
    from fa2gen.store.db import TunedDB
    from fa2gen.store.records import Entry, Measurement, Validity

    v = Validity(device, "9.0", triton_version or triton.__version__)
    entries = [
        Entry(
            v,
            Bucket("fwd", "fp16", d, "causal", False, 1, n, n, 64),
            TuningParams(128, 64, 4, 2, "tma_host"),
            Measurement(1.0, 0.9, 1.1, 500.0, 1e-3),
            default_ms=1.25,
            trials=9,
            code=code,
        )
        for d in (64, 128)
    ]
    TunedDB(path).put(entries)
    return entries


def test_show_export_import_round_trip(tmp_path):
    src, dst, yml = tmp_path / "a.sqlite", tmp_path / "b.sqlite", tmp_path / "out" / "NVIDIA_H200.yaml"
    entries = _db_with_entries(src)
    r = runner.invoke(app, ["show", "--db", str(src)])
    assert r.exit_code == 0 and "2 entries" in r.output and "1.25x" in r.output
    r = runner.invoke(app, ["export", "--arch", "sm90", "-o", str(yml), "--db", str(src)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["import", str(yml), "--db", str(dst)])
    assert r.exit_code == 0, r.output
    import dataclasses

    from fa2gen.store.db import TunedDB

    got = sorted((dataclasses.replace(e, created_at="") for e in TunedDB(dst).entries()), key=lambda e: e.bucket.key)
    assert got == sorted(entries, key=lambda e: e.bucket.key)
    assert all(e.created_at for e in TunedDB(dst).entries())  # stamped when first stored, kept through YAML
    r = runner.invoke(app, ["export", "--arch", "sm86", "-o", str(yml), "--db", str(src)])
    assert r.exit_code == 1 and "no sm86 entries" in r.output


def test_export_takes_current_entries_of_one_device(tmp_path):
    src, yml = tmp_path / "a.sqlite", tmp_path / "o.yaml"
    current = _db_with_entries(src)
    _db_with_entries(src, triton_version="3.5.0")  # an older tuning of the same device
    _db_with_entries(src, code="ffffffffffffffff", n=1024)  # measured on code that has changed since
    r = runner.invoke(app, ["show", "--db", str(src)])
    rows = [line for line in r.output.splitlines() if "fwd/fp16" in line]
    assert len(rows) == 6 and sum("changed" in row for row in rows) == 2 and sum("current" in row for row in rows) == 4
    r = runner.invoke(app, ["export", "--arch", "sm90", "-o", str(yml), "--db", str(src)])
    assert r.exit_code == 0, r.output
    from fa2gen.store.yamlfile import read

    assert len(read(yml).entries) == len(current)
    r = runner.invoke(app, ["export", "--arch", "sm90", "-o", str(yml), "--db", str(src), "--triton", "3.4.0"])
    assert r.exit_code == 1 and "6 tuned under another Triton or on changed code" in r.output
    _db_with_entries(src, device="NVIDIA_H100_80GB_HBM3")
    r = runner.invoke(app, ["export", "--arch", "sm90", "-o", str(yml), "--db", str(src)])
    assert r.exit_code == 1 and "pick one with --device" in r.output
    r = runner.invoke(app, ["export", "--arch", "sm90", "-o", str(yml), "--db", str(src), "--device", "NVIDIA_H200"])
    assert r.exit_code == 0


def test_export_records_the_tuning_machines_torch(tmp_path):
    """Exporting on another machine than the tuning one: --torch names the tuning machine's."""
    src, yml = tmp_path / "a.sqlite", tmp_path / "o.yaml"
    _db_with_entries(src)
    r = runner.invoke(app, ["export", "--arch", "sm90", "-o", str(yml), "--db", str(src), "--torch", "2.11.0+cu130"])
    assert r.exit_code == 0, r.output
    from fa2gen.store.yamlfile import read

    assert read(yml).meta["torch"] == "2.11.0+cu130"
    for bad in ("2.11\n!!python/object:os.system", "x" * 65):  # header values obey the reader's rules
        r = runner.invoke(
            app, ["export", "--arch", "sm90", "-o", str(tmp_path / "bad.yaml"), "--db", str(src), "--torch", bad]
        )
        assert r.exit_code == 1 and "torch" in r.output and not (tmp_path / "bad.yaml").exists()


@pytest.mark.parametrize(
    "args,hint",
    [
        (["--sampler", "Brute"], "sampler"),
        (["--limit", "0"], "limit"),
        (["--time-budget", "0"], "time-budget"),
        (["--workers", "-1"], "workers"),
        (["--trials", "0"], "trials"),
        (["--directions", "fwd,sideways"], "directions"),
    ],
)
def test_tune_rejects_bad_options_before_anything_else(args, hint):
    r = runner.invoke(app, ["tune", "--arch", "sm90", *args])
    assert r.exit_code == 2 and hint in r.output


@pytest.mark.parametrize(
    "text",
    ["!!python/object/apply:os.system ['echo pwned']\n", "a: [\n", "a: b: c\n", "- x\n y: [1\n", "\t- tab\n"],
    ids=["unsafe-tag", "unclosed", "nested-colon", "bad-indent", "tab"],
)
def test_import_rejects_bad_yaml_in_one_line(tmp_path, text):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    r = runner.invoke(app, ["import", str(bad), "--db", str(tmp_path / "x.sqlite")])
    assert r.exit_code == 1 and "not valid YAML" in r.output
    assert len(r.output.strip().splitlines()) == 1, r.output


def test_tune_refuses_without_gpu_or_bad_arch():
    r = runner.invoke(app, ["tune", "--arch", "sm75"])
    assert r.exit_code == 2 and "sm90" in r.output
    import torch

    if not torch.cuda.is_available():
        r = runner.invoke(app, ["tune", "--arch", "sm90"])
        assert r.exit_code == 2 and "no CUDA GPU" in r.output


def test_wheel_ships_tuned_configs(tmp_path):
    """A non-editable install must find tuned_configs/: build the wheel and look inside."""
    import shutil
    import zipfile
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    src = tmp_path / "src"
    shutil.copytree(root, src, ignore=shutil.ignore_patterns(".git", "*.egg-info", "build", "__pycache__", ".whl"))
    sample = src / "tuned_configs" / "sm90" / "TEST_DEVICE.yaml"
    sample.parent.mkdir(parents=True, exist_ok=True)
    sample.write_text("schema: 1\n")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    names = zipfile.ZipFile(next((tmp_path / "dist").glob("*.whl"))).namelist()
    assert "fa2gen/tuned_configs/sm90/TEST_DEVICE.yaml" in names
    assert "fa2gen/tuned_configs/README.md" in names
    assert "fa2gen/templates/attn_fwd.py.jinja" in names


def test_import_refuses_a_count_past_64_bits_in_one_line(tmp_path):
    """trials: 10**30 once passed validation and failed in the database with a traceback."""
    from test_store import _doc

    bad = tmp_path / "huge.yaml"
    bad.write_text(_doc(entry_trials=10**30))
    r = runner.invoke(app, ["import", str(bad), "--db", str(tmp_path / "x.sqlite")])
    assert r.exit_code == 1 and "trials" in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


def _broken_databases(tmp_path):
    """Files a results-database option may point at that are not a usable fa2gen database."""
    import sqlite3

    from fa2gen.store.db import TunedDB

    made = {}
    made["empty"] = tmp_path / "empty.sqlite"
    made["empty"].write_bytes(b"")
    made["garbage"] = tmp_path / "garbage.sqlite"
    made["garbage"].write_bytes(b"not a database" * 100)
    made["foreign"] = tmp_path / "foreign.sqlite"
    with sqlite3.connect(made["foreign"]) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.execute("INSERT INTO notes VALUES ('mine')")
    conn.close()
    made["truncated"] = tmp_path / "truncated.sqlite"
    TunedDB(made["truncated"]).dispose()
    data = made["truncated"].read_bytes()
    made["truncated"].write_bytes(data[: len(data) // 2])
    made["newer"] = tmp_path / "newer.sqlite"
    TunedDB(made["newer"]).dispose()
    with sqlite3.connect(made["newer"]) as conn:
        conn.execute("UPDATE schema_version SET version = 99")
    conn.close()
    made["directory"] = tmp_path / "adir"
    made["directory"].mkdir()
    return made


def test_read_only_commands_leave_every_file_as_it_was_and_say_one_line(tmp_path):
    """show created a missing database and its folders, added tables to another application's
    SQLite file (switching it to WAL) and made a zero-byte file a database; show and export
    printed tracebacks for broken files."""
    missing = tmp_path / "not" / "there.sqlite"
    r = runner.invoke(app, ["show", "--db", str(missing)])
    assert r.exit_code == 0 and "0 entries" in r.output and not missing.parent.exists()
    for name, path in _broken_databases(tmp_path).items():
        before = path.read_bytes() if path.is_file() else None
        for args in (["show"], ["export", "--arch", "sm90", "-o", str(tmp_path / "out.yaml")]):
            r = runner.invoke(app, [*args, "--db", str(path)])
            assert r.exit_code == 1 and not isinstance(r.exception, Exception), (name, args, r.exception)
            assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1, (name, args, r.output)
            if before is not None:
                assert path.read_bytes() == before, (name, args)
        assert not (tmp_path / "out.yaml").exists()


def test_import_into_a_broken_database_says_one_line(tmp_path):
    good = tmp_path / "good.yaml"
    from test_store import _doc

    good.write_text(_doc())
    for name, path in _broken_databases(tmp_path).items():
        if name == "empty":
            continue  # (an empty file is a new database to a writer)
        r = runner.invoke(app, ["import", str(good), "--db", str(path)])
        assert r.exit_code == 1 and not isinstance(r.exception, Exception), (name, r.exception)
        assert len(r.output.strip().splitlines()) == 1, (name, r.output)
