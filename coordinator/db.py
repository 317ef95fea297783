"""PostgreSQL connections with the coordinator's codecs (jsonb ↔ Python values)."""

from __future__ import annotations

import json
from typing import Any, TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy

__all__ = ["Connection", "create_pool"]

#: A connection, whether from a pool or opened directly.
Connection: TypeAlias = "asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]"


async def _init_connection(conn: Any) -> None:
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def _keep_session(conn: Any) -> None:
    """Skips asyncpg's reset query when a connection returns to the pool.

    The default reset (UNLISTEN, RESET ALL, advisory unlock, CLOSE ALL) is a
    round trip on every release, which on the lease path costs as much as the
    lease UPDATE itself. Pooled connections here carry no session state: LISTEN
    runs on a dedicated connection, nothing calls SET, advisory locks are
    transaction-scoped or released explicitly. An open transaction is still
    rolled back by asyncpg before this hook runs.
    """


async def create_pool(dsn: str, *, max_size: int) -> asyncpg.Pool:
    """Opens a pool whose jsonb columns decode to Python values."""
    pool: asyncpg.Pool = await asyncpg.create_pool(
        dsn, min_size=min(2, max_size), max_size=max_size, init=_init_connection, reset=_keep_session
    )
    return pool
