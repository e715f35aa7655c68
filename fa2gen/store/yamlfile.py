"""Tuned-config YAML files: the format shipped in ``tuned_configs/`` and moved by
``fa2gen export`` / ``fa2gen import``.

Reading is strict. The file is parsed with a safe loader that also refuses aliases
(no object construction, no billion-laughs expansion), every key must be known, and
every value is validated into the same dataclasses the database uses. The format is
documented in tuned_configs/README.md.
"""

from __future__ import annotations

import datetime
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..generator.arch import ARCHES
from ..generator.rendering import template_hash
from .records import (
    SCHEMA_VERSION,
    Entry,
    Measurement,
    RecordError,
    Validity,
    bucket_from_key,
    check_hash,
    check_number,
    params_from_data,
)

MAX_BYTES = 8 * 1024 * 1024
_META_KEYS = {"schema", "fa2gen", "device", "capability", "arch", "triton", "torch", "date", "entries"}
# Schema 1 stamped one hash of all of a direction's templates in the header; schema 2 stamps
# each entry with the digest of its variant's code (``code``). A schema-1 entry whose
# direction's templates are unchanged is read as tuned on today's code, else as stale.
_META_KEYS_V1 = _META_KEYS | {"template_hash"}
_ENTRY_KEYS = {
    "code",
    "bucket",
    "params",
    "median_ms",
    "p20_ms",
    "p80_ms",
    "tflops",
    "default_ms",
    "speedup",
    "max_error",
    "trials",
    "created_at",
}
_REQUIRED_ENTRY_KEYS = {"bucket", "params", "median_ms", "p20_ms", "p80_ms", "tflops", "max_error"}
_REQUIRED_ENTRY_KEYS_V2 = _REQUIRED_ENTRY_KEYS | {"code"}


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects aliases (config files never need them) and a key repeated in
    one mapping (which YAML loaders otherwise resolve silently, the last one winning)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, "aliases are not allowed in fa2gen config files", event.start_mark
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                repeated = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the base class says so
                break
            if repeated:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r:.40} appears twice in one mapping", key_node.start_mark
                )
        return super().construct_mapping(node, deep=deep)


@dataclass(frozen=True)
class ConfigFile:
    meta: dict  # validated header fields (everything but entries)
    entries: tuple[Entry, ...]
    skipped: tuple[str, ...] = ()  # why each entry a lenient read left out was invalid

    @property
    def arch(self) -> str:
        return self.meta["arch"]


def _text(name: str, value, max_len: int = 64) -> str:
    if not isinstance(value, str) or not value or len(value) > max_len or not value.isprintable():
        raise RecordError(f"{name}: expected a short printable string, got {value!r:.80}")
    return value


def _entry(raw, template_hashes: dict | None, header: dict, index: int) -> Entry:
    where = f"entries[{index}]"
    if not isinstance(raw, dict):
        raise RecordError(f"{where}: expected a mapping")
    unknown = set(map(str, raw)) - (_ENTRY_KEYS if template_hashes is None else _ENTRY_KEYS - {"code"})
    missing = (_REQUIRED_ENTRY_KEYS_V2 if template_hashes is None else _REQUIRED_ENTRY_KEYS) - set(raw)
    if unknown or missing:
        raise RecordError(f"{where}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
    try:
        bucket = bucket_from_key(raw["bucket"])
        if template_hashes is None:
            code = check_hash("code", raw["code"])  # required: an empty one would mean today's
        else:
            code = template_hashes.get(bucket.direction)
            if code is None:
                raise RecordError(f"no template_hash for direction {bucket.direction!r}")
            if code == template_hash(bucket.direction):
                code = ""  # tuned on today's templates: the current code's digest
        trials = raw.get("trials", 0)
        if isinstance(trials, bool) or not isinstance(trials, int) or trials < 0:
            raise RecordError(f"trials: invalid value {trials!r}")
        entry = Entry(
            validity=Validity(header["device"], header["capability"], header["triton"]),
            code=code,
            bucket=bucket,
            params=params_from_data(raw["params"]),
            measurement=Measurement(
                *(check_number(k, raw[k]) for k in ("median_ms", "p20_ms", "p80_ms", "tflops", "max_error"))
            ),
            default_ms=check_number("default_ms", raw.get("default_ms"), allow_none=True),
            trials=trials,
            created_at=_text("created_at", raw["created_at"]) if "created_at" in raw else "",
        )
        if "speedup" in raw:
            check_number("speedup", raw["speedup"], allow_none=True)
        return entry
    except RecordError as e:
        raise RecordError(f"{where}: {e}") from None


def yaml_problem(error: yaml.YAMLError) -> str:
    """A YAML error in one line: its problem and where (PyYAML's own text spans several,
    with the offending line quoted)."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    return f"{problem} (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else problem


def parse(text: str, *, lenient: bool = False) -> ConfigFile:
    """Validate YAML text into a ConfigFile; raises RecordError on anything off. ``lenient``:
    an invalid entry is left out (its reason in ``ConfigFile.skipped``) rather than failing the
    file, as the runtime reads shipped files; a bad header still fails it."""
    try:
        return _parse(text, lenient)
    except RecordError:
        raise
    except Exception as e:  # unhashable keys, absurd numbers, deep nesting: still just a bad file
        raise RecordError(f"invalid file: {type(e).__name__}: {str(e)[:80]}") from None


def _parse(text: str, lenient: bool) -> ConfigFile:
    if len(text.encode()) > MAX_BYTES:
        raise RecordError(f"file larger than {MAX_BYTES} bytes")
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: never constructs objects
    except yaml.YAMLError as e:
        raise RecordError(f"not valid YAML: {yaml_problem(e)}") from None
    if not isinstance(data, dict):
        raise RecordError("top level must be a mapping")
    schema = data.get("schema")
    if schema not in (1, SCHEMA_VERSION) or isinstance(schema, bool):
        raise RecordError(f"schema: this fa2gen reads v1 and v{SCHEMA_VERSION}, file is {schema!r:.40}")
    keys = _META_KEYS_V1 if schema == 1 else _META_KEYS
    unknown, missing = set(map(str, data)) - keys, keys - set(data)
    if unknown or missing:
        raise RecordError(f"unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
    if not isinstance(data["arch"], str) or data["arch"] not in ARCHES:
        raise RecordError(f"arch: unknown {data['arch']!r}")
    capability = data["capability"]
    if not isinstance(capability, str):
        raise RecordError(f"capability must be a quoted string like '9.0', got {capability!r}")
    hashes = None
    if schema == 1:
        hashes = data["template_hash"]
        if not isinstance(hashes, dict) or not hashes:
            raise RecordError("template_hash: expected a mapping of direction to hash")
        hashes = {_text("template_hash key", k): check_hash("template_hash", v) for k, v in hashes.items()}
    meta = {
        "schema": schema,
        "fa2gen": _text("fa2gen", data["fa2gen"]),
        "device": data["device"],
        "capability": capability,
        "arch": data["arch"],
        "triton": data["triton"],
        "torch": _text("torch", data["torch"]),
        "date": _text("date", str(data["date"])),
    }
    validity = Validity(meta["device"], capability, meta["triton"])  # checks device, capability and triton
    if validity.arch != meta["arch"]:
        raise RecordError(f"arch: {meta['arch']} disagrees with capability {capability} ({validity.arch})")
    raw_entries = data["entries"]
    if not isinstance(raw_entries, list):
        raise RecordError("entries: expected a list")
    entries, skipped, first = [], [], {}
    for i, raw in enumerate(raw_entries):
        try:
            e = _entry(raw, hashes, meta, i)
            j = first.setdefault(e.bucket.key, i)
            if j != i:  # (one file holds one answer per bucket: two would be one silently dropped)
                raise RecordError(f"entries[{j}] and entries[{i}] are both for bucket {e.bucket.key}")
        except RecordError as err:
            if not lenient:
                raise
            skipped.append(str(err))
            continue
        entries.append(e)
    return ConfigFile(meta, tuple(entries), tuple(skipped))


def read(path: str | Path, *, lenient: bool = False) -> ConfigFile:
    """The config file at ``path``, as ``parse`` reads it (``lenient``: bad entries left out)."""
    return parse(read_text(path), lenient=lenient)


def read_text(path: str | Path, limit: int = MAX_BYTES) -> str:
    """A regular file's text, at most ``limit`` bytes, or RecordError. Opened without blocking
    and checked on the open descriptor: a FIFO (which would block a read until a writer came)
    and devices such as /dev/zero (whose size reads 0 and whose text never ends) are refused."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise RecordError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RecordError(f"cannot read {path}: not a regular file")
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    except OSError as e:
        raise RecordError(f"cannot read {path}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise RecordError(f"file larger than {limit} bytes")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise RecordError(f"{path} is not UTF-8 text") from None


def dump(entries: list[Entry], *, arch: str, fa2gen_version: str, torch_version: str) -> str:
    """YAML text for entries of one device (all entries must share device and Triton)."""
    if not entries:
        raise RecordError("nothing to export")
    first = entries[0].validity
    if any(e.validity != first for e in entries):
        raise RecordError("entries for one file must share device, capability, Triton and schema")
    doc = {
        "schema": SCHEMA_VERSION,
        "fa2gen": str(fa2gen_version),
        "device": first.device,
        "capability": first.capability,
        "arch": arch,
        "triton": first.triton,
        # str(): torch.__version__ is a str subclass yaml cannot represent; checked as on reading
        "torch": _text("torch", str(torch_version)),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "entries": [
            {
                "bucket": e.bucket.key,
                "params": e.params.to_dict(),
                "code": e.code,
                "median_ms": round(e.measurement.median_ms, 6),
                "p20_ms": round(e.measurement.p20_ms, 6),
                "p80_ms": round(e.measurement.p80_ms, 6),
                "tflops": round(e.measurement.tflops, 2),
                "default_ms": None if e.default_ms is None else round(e.default_ms, 6),
                "speedup": None if e.speedup is None else round(e.speedup, 4),
                "max_error": e.measurement.max_error,
                "trials": e.trials,
                **({"created_at": e.created_at} if e.created_at else {}),
            }
            for e in sorted(entries, key=lambda e: e.bucket.key)
        ],
    }
    return yaml.safe_dump(doc, sort_keys=False, width=120)
