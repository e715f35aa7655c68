"""Tuned-config YAML files: the format shipped in ``tuned_configs/`` and moved by
``fa2gen export`` / ``fa2gen import``.

Reading is strict. The file is parsed with a safe loader that also refuses aliases
(no object construction, no billion-laughs expansion), every key must be known, and
every value is validated into the same dataclasses the database uses. The format is
documented in tuned_configs/README.md.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..generator.arch import ARCHES
from .records import (
    SCHEMA_VERSION,
    Entry,
    Measurement,
    RecordError,
    Validity,
    bucket_from_key,
    check_number,
    params_from_data,
)

MAX_BYTES = 8 * 1024 * 1024
_META_KEYS = {"schema", "fa2gen", "device", "capability", "arch", "triton", "torch", "template_hash", "date", "entries"}
_ENTRY_KEYS = {
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


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects aliases: config files never need them."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, "aliases are not allowed in fa2gen config files", event.start_mark
            )
        return super().compose_node(parent, index)


@dataclass(frozen=True)
class ConfigFile:
    meta: dict  # validated header fields (everything but entries)
    entries: tuple[Entry, ...]

    @property
    def arch(self) -> str:
        return self.meta["arch"]


def _text(name: str, value, max_len: int = 64) -> str:
    if not isinstance(value, str) or not value or len(value) > max_len or not value.isprintable():
        raise RecordError(f"{name}: expected a short printable string, got {value!r:.80}")
    return value


def _entry(raw, template_hash: dict, header: dict, index: int) -> Entry:
    where = f"entries[{index}]"
    if not isinstance(raw, dict):
        raise RecordError(f"{where}: expected a mapping")
    unknown = set(map(str, raw)) - _ENTRY_KEYS
    missing = _REQUIRED_ENTRY_KEYS - set(raw)
    if unknown or missing:
        raise RecordError(f"{where}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
    try:
        bucket = bucket_from_key(raw["bucket"])
        th = template_hash.get(bucket.direction)
        if th is None:
            raise RecordError(f"no template_hash for direction {bucket.direction!r}")
        trials = raw.get("trials", 0)
        if isinstance(trials, bool) or not isinstance(trials, int) or trials < 0:
            raise RecordError(f"trials: invalid value {trials!r}")
        entry = Entry(
            validity=Validity(header["device"], header["capability"], header["triton"], th, header["schema"]),
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


def parse(text: str) -> ConfigFile:
    """Validate YAML text into a ConfigFile; raises RecordError on anything off."""
    try:
        return _parse(text)
    except RecordError:
        raise
    except Exception as e:  # unhashable keys, absurd numbers, deep nesting: still just a bad file
        raise RecordError(f"invalid file: {type(e).__name__}: {str(e)[:80]}") from None


def _parse(text: str) -> ConfigFile:
    if len(text.encode()) > MAX_BYTES:
        raise RecordError(f"file larger than {MAX_BYTES} bytes")
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: never constructs objects
    except yaml.YAMLError as e:
        raise RecordError(f"not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise RecordError("top level must be a mapping")
    unknown, missing = set(map(str, data)) - _META_KEYS, _META_KEYS - set(data)
    if unknown or missing:
        raise RecordError(f"unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
    schema = data["schema"]
    if schema != SCHEMA_VERSION or isinstance(schema, bool):
        raise RecordError(f"schema: this fa2gen reads v{SCHEMA_VERSION}, file is {schema!r}")
    if not isinstance(data["arch"], str) or data["arch"] not in ARCHES:
        raise RecordError(f"arch: unknown {data['arch']!r}")
    capability = data["capability"]
    if not isinstance(capability, str):
        raise RecordError(f"capability must be a quoted string like '9.0', got {capability!r}")
    template_hash = data["template_hash"]
    if not isinstance(template_hash, dict) or not template_hash:
        raise RecordError("template_hash: expected a mapping of direction to hash")
    meta = {
        "schema": schema,
        "fa2gen": _text("fa2gen", data["fa2gen"]),
        "device": data["device"],
        "capability": capability,
        "arch": data["arch"],
        "triton": data["triton"],
        "torch": _text("torch", data["torch"]),
        "template_hash": {_text("template_hash key", k): v for k, v in template_hash.items()},
        "date": _text("date", str(data["date"])),
    }
    # Validity checks device, capability, triton and each hash's format.
    for direction, th in meta["template_hash"].items():
        Validity(meta["device"], capability, meta["triton"], th, schema)
    raw_entries = data["entries"]
    if not isinstance(raw_entries, list):
        raise RecordError("entries: expected a list")
    entries = tuple(_entry(raw, meta["template_hash"], meta, i) for i, raw in enumerate(raw_entries))
    return ConfigFile(meta, entries)


def read(path: str | Path) -> ConfigFile:
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise RecordError(f"file larger than {MAX_BYTES} bytes")
        return parse(path.read_text())
    except OSError as e:
        raise RecordError(f"cannot read {path}: {e}") from None
    except UnicodeDecodeError:
        raise RecordError(f"{path} is not UTF-8 text") from None


def dump(entries: list[Entry], *, arch: str, fa2gen_version: str, torch_version: str) -> str:
    """YAML text for entries of one device (all entries must share device and Triton)."""
    if not entries:
        raise RecordError("nothing to export")
    first = entries[0].validity
    hashes: dict[str, str] = {}
    for e in entries:
        v = e.validity
        if (v.device, v.capability, v.triton, v.schema) != (first.device, first.capability, first.triton, first.schema):
            raise RecordError("entries for one file must share device, capability, Triton and schema")
        if hashes.setdefault(e.bucket.direction, v.template_hash) != v.template_hash:
            raise RecordError(f"entries of direction {e.bucket.direction} carry two template hashes")
    doc = {
        "schema": first.schema,
        "fa2gen": str(fa2gen_version),
        "device": first.device,
        "capability": first.capability,
        "arch": arch,
        "triton": first.triton,
        # str(): torch.__version__ is a str subclass yaml cannot represent; checked as on reading
        "torch": _text("torch", str(torch_version)),
        "template_hash": hashes,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "entries": [
            {
                "bucket": e.bucket.key,
                "params": e.params.to_dict(),
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
