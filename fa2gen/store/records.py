"""One tuned result and the key that says where it is valid."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..generator.arch import arch_from_capability
from ..generator.identity import code_digest
from ..generator.spec import SpecError, TuningParams, unsupported
from .buckets import Bucket

SCHEMA_VERSION = 2  # 2: validity per variant (each entry's code digest), was per direction's templates
_DEVICE = re.compile(r"^[A-Za-z0-9_]{1,64}$")
_CAPABILITY = re.compile(r"^\d{1,2}\.\d{1,2}$")
_TRITON = re.compile(r"^\d{1,3}\.\d{1,3}[A-Za-z0-9_.+-]{0,56}$")  # major.minor first: compared by them
_HASH = re.compile(r"^[0-9a-f]{16}$")


class RecordError(ValueError):
    """A stored value that fails validation."""


def check_str(name: str, value, pattern: re.Pattern) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise RecordError(f"{name}: invalid value {value!r}")
    return value


def check_hash(name: str, value) -> str:
    """A 16-hex-digit digest (a code digest, a template hash)."""
    return check_str(name, value, _HASH)


def check_number(
    name: str, value, *, minimum: float = 0.0, positive: bool = False, allow_none: bool = False
) -> float | None:
    if value is None and allow_none:
        return None
    try:
        ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
        number = float(value) if ok else None
    except OverflowError:  # an int too large for a float
        ok, number = False, None
    if not ok or number < minimum or (positive and number <= 0):
        bound = "> 0" if positive else f">= {minimum}"
        raise RecordError(f"{name}: expected a finite number {bound}, got {value!r:.40}")
    return number


@dataclass(frozen=True)
class Validity:
    """Where an entry applies: a device, its capability, the Triton that compiled it and the
    record format. (Which code it was tuned on is the entry's own: ``Entry.code``.)"""

    device: str
    capability: str
    triton: str
    schema: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        check_str("device", self.device, _DEVICE)
        check_str("capability", self.capability, _CAPABILITY)
        check_str("triton", self.triton, _TRITON)
        if isinstance(self.schema, bool) or not isinstance(self.schema, int) or self.schema < 1:
            raise RecordError(f"schema: invalid value {self.schema!r}")

    @property
    def arch(self) -> str:
        return arch_from_capability(*map(int, self.capability.split(".")))


@dataclass(frozen=True)
class Measurement:
    median_ms: float
    p20_ms: float
    p80_ms: float
    tflops: float
    max_error: float

    def __post_init__(self) -> None:
        for name in ("median_ms", "p20_ms", "p80_ms"):
            check_number(name, getattr(self, name), positive=True)
        for name in ("tflops", "max_error"):
            check_number(name, getattr(self, name))
        if not self.p20_ms <= self.median_ms <= self.p80_ms:
            raise RecordError(
                "p20_ms <= median_ms <= p80_ms must hold, got "
                f"{self.p20_ms!r:.12}, {self.median_ms!r:.12}, {self.p80_ms!r:.12}"
            )


@dataclass(frozen=True)
class Entry:
    """The best params found for a bucket, with how they measured, and the digest of the code
    they rendered to when they were measured (``code``; left empty, the current code's)."""

    validity: Validity
    bucket: Bucket
    params: TuningParams
    measurement: Measurement
    default_ms: float | None = None
    trials: int = 0
    created_at: str = field(default="")
    code: str = ""

    def __post_init__(self) -> None:
        check_number("default_ms", self.default_ms, positive=True, allow_none=True)
        if isinstance(self.trials, bool) or not isinstance(self.trials, int) or not 0 <= self.trials < 2**63:
            # (SQLite stores 64-bit integers: a larger count would fail on write, after validation)
            raise RecordError(f"trials: expected an integer from 0 to 2**63 - 1, got {self.trials!r:.40}")
        if not isinstance(self.created_at, str) or len(self.created_at) > 64:
            raise RecordError(f"created_at: invalid value {self.created_at!r}")
        # Params that cannot render for the bucket's kernel (a backward knob on a forward
        # bucket, say) would fail at dispatch: refuse them where they are read.
        why = unsupported(self.bucket.kernel_spec(), self.params)
        if why:
            raise RecordError(f"params for {self.bucket.key}: {why}")
        if self.code == "":
            object.__setattr__(self, "code", self._digest())
        check_hash("code", self.code)

    def _digest(self) -> str:
        # the code the params render to under the Triton version the entry was tuned under
        return code_digest(self.bucket.kernel_spec(), self.params, self.validity.triton)

    @property
    def current(self) -> bool:
        """Whether the params still render to the code they were measured on (under the Triton
        version they were measured under): a comment edit in a template keeps an entry valid,
        a change to what its variant computes does not."""
        return self.code == self._digest()

    @property
    def speedup(self) -> float | None:
        """Default config's time over this config's (None if the default was not timed)."""
        if self.default_ms is None:
            return None
        return self.default_ms / self.measurement.median_ms


def params_from_data(data) -> TuningParams:
    try:
        return TuningParams.from_dict(data)
    except (SpecError, TypeError) as e:
        raise RecordError(f"params: {e}") from None


def bucket_from_key(key) -> Bucket:
    try:
        return Bucket.parse(key)
    except SpecError as e:
        raise RecordError(f"bucket: {e}") from None
