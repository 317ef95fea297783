"""The workflow registry: immutable, versioned definitions.

A version never changes once written, so parsed definitions are cached for the
life of the process; every run pins the version it started with.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import asyncpg

from coordinator.db import Connection
from coordinator.definitions import Workflow
from coordinator.errors import NotFound

__all__ = ["WorkflowRegistry"]

_LATEST = """
SELECT version, digest FROM workflows WHERE name = $1 ORDER BY version DESC LIMIT 1
"""
_INSERT = """
INSERT INTO workflows (name, version, definition, digest) VALUES ($1, $2, $3::jsonb, $4)
"""
_DEFINITION = """
SELECT definition FROM workflows WHERE name = $1 AND version = $2
"""


class WorkflowRegistry:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._cache: dict[tuple[str, int], Workflow] = {}

    async def register(self, document: Any) -> tuple[str, int, bool]:
        """Validates and stores a definition; returns (name, version, created).

        Registering a definition identical to the latest version returns that
        version (created=False), so re-registering at every start is harmless.

        Raises:
            InvalidDefinition: the definition does not validate.
        """
        workflow = Workflow.parse(document)
        digest = workflow.digest()
        async with self._pool.acquire() as conn, conn.transaction():
            # Serialises registrations of one name, so versions stay dense.
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", workflow.name)
            latest = await conn.fetchrow(_LATEST, workflow.name)
            if latest is not None and latest["digest"] == digest:
                return workflow.name, latest["version"], False
            version = 1 if latest is None else latest["version"] + 1
            await conn.execute(_INSERT, workflow.name, version, document, digest)
        self._cache[(workflow.name, version)] = dataclasses.replace(workflow, version=version)
        return workflow.name, version, True

    async def latest_version(self, name: str) -> int:
        """Raises NotFound when no version of `name` exists."""
        row = await self._pool.fetchrow(_LATEST, name)
        if row is None:
            raise NotFound(f"workflow {name!r} is not registered")
        version: int = row["version"]
        return version

    async def get(self, name: str, version: int, conn: Connection | None = None) -> Workflow:
        """Returns a parsed version, from cache when possible.

        Raises:
            NotFound: the version does not exist.
        """
        cached = self._cache.get((name, version))
        if cached is not None:
            return cached
        executor = conn if conn is not None else self._pool
        document = await executor.fetchval(_DEFINITION, name, version)
        if document is None:
            raise NotFound(f"workflow {name!r} has no version {version}")
        workflow = dataclasses.replace(Workflow.parse(document), version=version)
        self._cache[(name, version)] = workflow
        return workflow
