"""The tuned-results database: SQLite through SQLAlchemy 2.0.

WAL journal and a busy timeout let several tuners and readers share one file; write
transactions start with BEGIN IMMEDIATE so that two writers queue on the lock instead
of failing with "database is locked" when both try to upgrade a read lock. The schema
carries a version row that is upgraded step by step, never silently.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import sqlite3
from pathlib import Path
from typing import Iterable, Iterator

from sqlalchemy import Float, Integer, String, Text, UniqueConstraint, create_engine, event, select, text
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from ..paths import user_cache_root
from .buckets import Bucket
from .records import (
    SCHEMA_VERSION,
    Entry,
    Measurement,
    RecordError,
    Validity,
    bucket_from_key,
    check_hash,
    params_from_data,
)

log = logging.getLogger(__name__)
BUSY_TIMEOUT_MS = 60_000


class StoreError(RuntimeError):
    """The database cannot be used (newer schema, not a database, unreadable)."""


class Base(DeclarativeBase):
    pass


class SchemaRow(Base):
    __tablename__ = "schema_version"
    version: Mapped[int] = mapped_column(Integer, primary_key=True)


class TunedRow(Base):
    __tablename__ = "tuned"
    __table_args__ = (UniqueConstraint("device", "capability", "triton", "schema", "bucket"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    device: Mapped[str] = mapped_column(String(64))
    capability: Mapped[str] = mapped_column(String(8))
    triton: Mapped[str] = mapped_column(String(64))
    schema: Mapped[int] = mapped_column(Integer)
    bucket: Mapped[str] = mapped_column(String(128))
    params: Mapped[str] = mapped_column(Text)
    median_ms: Mapped[float] = mapped_column(Float)
    p20_ms: Mapped[float] = mapped_column(Float)
    p80_ms: Mapped[float] = mapped_column(Float)
    tflops: Mapped[float] = mapped_column(Float)
    default_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    speedup: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_error: Mapped[float] = mapped_column(Float)
    trials: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[str] = mapped_column(String(64))
    code: Mapped[str] = mapped_column(String(16))  # digest of the code the params rendered to


_KEY_COLUMNS = ("device", "capability", "triton", "schema", "bucket")


def _upgrade_1(session: Session) -> None:
    """v1 keyed rows by the hash of all of a direction's templates; v2 keeps one row a bucket
    and stamps it with its variant's code digest. A row tuned on today's templates gets
    today's digest; any other keeps its old hash, which no digest matches (stale). Of two
    rows of one bucket, the one tuned on today's templates stays, else the faster."""
    from ..generator.identity import code_digest
    from ..generator.rendering import template_hash

    conn = session.connection()
    conn.exec_driver_sql("ALTER TABLE tuned RENAME TO tuned_v1")
    Base.metadata.create_all(conn)
    columns = [c.name for c in TunedRow.__table__.columns if c.name not in ("id", "code", "schema")]
    rows = conn.exec_driver_sql(f"SELECT {', '.join(columns)}, template_hash FROM tuned_v1").fetchall()
    kept: dict[tuple, tuple[bool, float, dict]] = {}
    for row in rows:
        values = dict(zip(columns, row[:-1]))
        old_hash = row[-1]
        code, current = old_hash, False
        try:
            bucket = bucket_from_key(values["bucket"])
            if old_hash == template_hash(bucket.direction):
                params = params_from_data(json.loads(values["params"]))
                code = code_digest(bucket.kernel_spec(), params, values["triton"])
                current = True
        except Exception:  # an invalid row moves as it is; reading it later skips it
            pass
        values.update(code=str(code)[:16], schema=SCHEMA_VERSION)
        key = tuple(values[c] for c in _KEY_COLUMNS)
        rank = (current, -float(values["median_ms"] or 0))
        if key not in kept or rank > kept[key][:2]:
            kept[key] = (*rank, values)
    if kept:
        conn.execute(TunedRow.__table__.insert(), [v for *_, v in kept.values()])
    conn.exec_driver_sql("DROP TABLE tuned_v1")


# Upgrades from version N to N + 1, applied in order inside one transaction.
_UPGRADES: dict[int, callable] = {1: _upgrade_1}


def default_db_path() -> Path:
    """``FA2GEN_DB`` if set, else ``tuned.sqlite`` in the user cache dir."""
    override = os.environ.get("FA2GEN_DB")
    return Path(override) if override else user_cache_root() / "tuned.sqlite"


def _entry_from_row(row: TunedRow) -> Entry:
    """Validate one row; anything off (even a pathological value) becomes a RecordError."""
    try:
        return _build_entry(row)
    except RecordError:
        raise
    except Exception as e:  # RecursionError from nested JSON, OverflowError, wrong column types...
        raise RecordError(f"{type(e).__name__}: {str(e)[:80]}") from None


def _build_entry(row: TunedRow) -> Entry:
    try:
        params = json.loads(row.params)
    except (TypeError, ValueError):
        raise RecordError(f"params: not JSON: {row.params!r:.80}") from None
    return Entry(
        validity=Validity(row.device, row.capability, row.triton, row.schema),
        code=check_hash("code", row.code),  # required: an empty one would make Entry take today's
        bucket=bucket_from_key(row.bucket),
        params=params_from_data(params),
        measurement=Measurement(row.median_ms, row.p20_ms, row.p80_ms, row.tflops, row.max_error),
        default_ms=row.default_ms,
        trials=row.trials,
        created_at=row.created_at,
    )


def _current(row: TunedRow) -> bool:
    try:
        return _entry_from_row(row).current
    except RecordError:
        return False


def _row_values(entry: Entry) -> dict:
    v, m = entry.validity, entry.measurement
    return {
        "device": v.device,
        "capability": v.capability,
        "triton": v.triton,
        "schema": v.schema,
        "bucket": entry.bucket.key,
        "params": json.dumps(entry.params.to_dict(), sort_keys=True),
        "median_ms": m.median_ms,
        "p20_ms": m.p20_ms,
        "p80_ms": m.p80_ms,
        "tflops": m.tflops,
        "default_ms": entry.default_ms,
        "speedup": entry.speedup,
        "max_error": m.max_error,
        "trials": entry.trials,
        "created_at": entry.created_at or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "code": entry.code,
    }


def _scope(validity: Validity) -> dict:
    return dataclasses.asdict(validity)  # the row columns a validity names


# Rows of one INSERT: each binds one SQL variable per column (16), and SQLite caps a statement's
# variables (999 before 3.32, 32766 since): 2048 rows of 16 overflowed the newer cap.
_ROWS_PER_STATEMENT = 60


def _without_shared_memory(path: Path) -> bool:
    """Whether a read-only open of ``path`` fails for want of its -shm file: a WAL
    database's readers need one, and cannot create it in a folder this user cannot write
    (SQLite then reports a write to a read-only database, or an I/O error)."""
    return path.is_file() and not path.with_name(path.name + "-shm").exists() and not os.access(path.parent, os.W_OK)


def _upsert(rows: list[dict], superseding: Entry | None):
    """The INSERT of ``rows`` that keeps, per key, the faster row (or replaces ``superseding``,
    the entry the caller timed again beside the new one, where the row still holds it)."""
    stmt = sqlite_insert(TunedRow).values(rows)
    excluded = stmt.excluded
    faster = excluded.median_ms < TunedRow.median_ms
    if superseding is not None:
        old = _row_values(superseding)
        unchanged = (
            (TunedRow.params == old["params"])
            & (TunedRow.median_ms == old["median_ms"])
            & (TunedRow.created_at == old["created_at"])
        )
        faster = faster | unchanged
    return stmt.on_conflict_do_update(
        index_elements=list(_KEY_COLUMNS),
        set_={c: getattr(excluded, c) for c in rows[0] if c not in _KEY_COLUMNS},
        where=faster,
    )


class TunedDB:
    """Read and write tuned entries in one SQLite file."""

    def __init__(self, path: str | os.PathLike | None = None, *, readonly: bool = False):
        """Open (and create or upgrade) the database; ``readonly`` opens an existing file
        for lookups only: no schema changes, no write locks."""
        self.path = Path(path) if path is not None else default_db_path()
        self.readonly = readonly
        if not readonly:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        # Connect through sqlite3 directly: a path is never parsed as a URL ('%', '#', '?').
        self._target = self.path.resolve().as_uri() + "?mode=ro" if readonly else str(self.path)

        def connect():
            return sqlite3.connect(self._target, uri=readonly, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False)

        self.engine = create_engine("sqlite://", creator=connect)

        @event.listens_for(self.engine, "connect")
        def _on_connect(dbapi_conn, _record):
            dbapi_conn.isolation_level = None  # SQLAlchemy emits BEGIN itself (below)
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            if not readonly:
                cur.execute("PRAGMA journal_mode=WAL")
            cur.close()

        @event.listens_for(self.engine, "begin")
        def _on_begin(conn):
            conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")

        try:
            self._open()
        except StoreError as e:
            if not (readonly and _without_shared_memory(self.path)):
                raise
            self._open_immutable(e)

    def _open(self) -> None:
        """Check (read-only) or create and upgrade the schema; any failure as a StoreError."""
        try:
            self._check_version() if self.readonly else self._migrate()
        except StoreError:
            raise
        except Exception as e:  # a corrupt file or not a database at all
            raise StoreError(f"cannot open tuned database {self.path}: {e}") from e

    def _open_immutable(self, error: StoreError) -> None:
        """Read a write-ahead-log database whose folder this user cannot write (a shared,
        admin-tuned one): SQLite's readers need a -shm file beside it, which they cannot
        create there. Read the file as immutable instead, which needs none, where no
        committed page waits in a -wal file (immutable reads ignore it)."""
        wal = self.path.with_name(self.path.name + "-wal")
        if wal.exists() and wal.stat().st_size > 0:
            raise StoreError(
                f"cannot read tuned database {self.path}: its folder is not writable here and its "
                "write-ahead log holds pages not yet in the file (its owner can run "
                "PRAGMA wal_checkpoint(TRUNCATE))"
            ) from error
        self.engine.dispose()
        self._target = self.path.resolve().as_uri() + "?immutable=1"
        self._open()

    def _migrate(self) -> None:
        with Session(self.engine) as session, session.begin():
            tables = {r[0] for r in session.execute(text("SELECT name FROM sqlite_master WHERE type = 'table'"))}
            if tables and SchemaRow.__tablename__ not in tables:  # never write into another application's file
                raise StoreError(f"{self.path} is an SQLite database of something else (tables {sorted(tables)[:5]})")
            Base.metadata.create_all(session.connection())
            version = session.scalar(select(SchemaRow.version))
            if version is None:
                session.add(SchemaRow(version=SCHEMA_VERSION))
                return
            if version > SCHEMA_VERSION:
                raise StoreError(f"{self.path} has schema v{version}, newer than this fa2gen (v{SCHEMA_VERSION})")
            while version < SCHEMA_VERSION:
                _UPGRADES[version](session)
                session.query(SchemaRow).update({SchemaRow.version: version + 1})
                version += 1

    def _check_version(self) -> None:
        version = self.schema_version()
        if version != SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} has schema v{version}; this fa2gen reads v{SCHEMA_VERSION}"
                + (" (run any write, e.g. fa2gen import, to upgrade it)" if version < SCHEMA_VERSION else "")
            )

    def schema_version(self) -> int:
        with Session(self.engine) as session:
            return session.scalar(select(SchemaRow.version))

    def put(self, entries: Iterable[Entry], *, superseding: Entry | None = None) -> int:
        """Insert or improve entries: an existing row is replaced by a faster one, or by any
        where the row is still ``superseding`` (same params, time and date), the entry the
        caller timed again beside the new one, in one study where the times compare; a row
        another writer changed meanwhile is then replaced only by a faster one. A row whose
        params no longer render to the code it was measured on is replaced by any entry."""
        rows = [_row_values(e) for e in entries]
        if not rows:
            return 0
        if superseding is not None and (len(rows) != 1 or rows[0]["bucket"] != superseding.bucket.key):
            raise ValueError("put: superseding applies to one entry of its own bucket")
        with Session(self.engine) as session, session.begin():
            for row in rows:  # stale rows go first (inside the write lock): their times compare with nothing
                key = {c: row[c] for c in _KEY_COLUMNS}
                held = session.scalars(select(TunedRow).filter_by(**key)).first()
                if held is not None and not _current(held):
                    session.delete(held)
            session.flush()
            # in statements of at most _ROWS_PER_STATEMENT rows, all in this one transaction
            for i in range(0, len(rows), _ROWS_PER_STATEMENT):
                session.execute(_upsert(rows[i : i + _ROWS_PER_STATEMENT], superseding))
        return len(rows)

    def _rows(self, **filters) -> list[TunedRow]:
        stmt = select(TunedRow)
        for name, value in filters.items():
            if value is not None:
                stmt = stmt.where(getattr(TunedRow, name) == value)
        with Session(self.engine, expire_on_commit=False) as session:
            return list(session.scalars(stmt.order_by(TunedRow.bucket)))

    def entries(self, **filters) -> Iterator[Entry]:
        """Valid entries matching column filters; invalid rows are logged and skipped."""
        for row in self._rows(**filters):
            try:
                yield _entry_from_row(row)
            except RecordError as e:
                log.warning("fa2gen: skipping invalid row %s in %s: %s", row.id, self.path, e)

    def get(self, validity: Validity, bucket: Bucket) -> Entry | None:
        """The bucket's entry where ``validity`` holds, if its params still render to the code
        it was measured on."""
        found = [e for e in self.entries(**_scope(validity), bucket=bucket.key) if e.current]
        return found[0] if found else None

    def current(self, validity: Validity) -> list[Entry]:
        """Every entry where ``validity`` holds whose params still render to its code."""
        return [e for e in self.entries(**_scope(validity)) if e.current]

    def count_stale(self, validity: Validity) -> int:
        """Rows for this device tuned under another Triton or schema, or on code that changed."""
        rows = self._rows(device=validity.device, capability=validity.capability)
        return sum(
            1 for row in rows if (row.triton, row.schema) != (validity.triton, validity.schema) or not _current(row)
        )

    def dispose(self) -> None:
        self.engine.dispose()
