"""Applies the SQL migrations in `coordinator/migrations/` at start.

Each file `NNNN_name.sql` runs once, in its own transaction, and is recorded in
`schema_migrations`; applying them again is a no-op. An advisory lock makes
concurrent coordinator replicas take turns, so two starting at once cannot race.
"""

from __future__ import annotations

import logging
import re
from importlib import resources

from coordinator.db import Connection

__all__ = ["apply_migrations"]

log = logging.getLogger(__name__)

_LOCK_KEY = 0x5746_4D49  # "WFMI": one lock id for the migrations of this schema
_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


def _migrations() -> list[tuple[int, str, str]]:
    found = []
    for entry in resources.files("coordinator").joinpath("migrations").iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry.name, entry.read_text()))
    return sorted(found)


async def apply_migrations(conn: Connection) -> list[str]:
    """Applies every migration not yet recorded; returns the names applied."""
    applied: list[str] = []
    await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_KEY)
    try:
        await conn.execute(
            """CREATE TABLE IF NOT EXISTS schema_migrations (
                   version     integer     PRIMARY KEY,
                   name        text        NOT NULL,
                   applied_at  timestamptz NOT NULL DEFAULT now())"""
        )
        done = {row["version"] for row in await conn.fetch("SELECT version FROM schema_migrations")}
        for version, name, sql in _migrations():
            if version in done:
                continue
            async with conn.transaction():
                await conn.execute(sql)
                await conn.execute("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", version, name)
            log.info("applied migration %s", name)
            applied.append(name)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_KEY)
    return applied
