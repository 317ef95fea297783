"""Routes a task to what runs it (seed step 9).

``python``, ``js`` and its alias ``node`` (the runtime of a CODE node) go to
that runtime's language server through the client manager; anything else goes
to the built-in executor registered for the node type (``http``). Control-flow
nodes (SWITCH) never reach a worker: the coordinator evaluates them. An
unknown node type, or a runtime without a configured language server, is a
task failure that names it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from worker.config import LANGUAGE_RUNTIMES, canonical_runtime
from worker.executors import ExecutionResult, Executor, TaskContext
from worker.langclient import LangClientManager

__all__ = ["Router"]


class Router:
    """Chooses the executor of each task by its node type."""

    def __init__(self, executors: Iterable[Executor], languages: LangClientManager) -> None:
        self._executors = {executor.node_type: executor for executor in executors}
        self._languages = languages

    async def route(self, node_type: str, task: TaskContext, task_input: Any) -> ExecutionResult:
        """Runs the task on the executor for `node_type`.

        Returns:
            The execution's result; a failure naming the node type when nothing can run it.
        """
        runtime = canonical_runtime(node_type)
        if runtime in LANGUAGE_RUNTIMES:
            client = self._languages.client_for(runtime)
            if client is None:
                return ExecutionResult.failed(
                    f"no language server configured for runtime {runtime!r} on this worker (LANG_WORKER_ADDRS)"
                )
            return await client.execute(task, task_input)
        executor = self._executors.get(runtime)
        if executor is None:
            return ExecutionResult.failed(f"no executor for node type {node_type!r}")
        return await executor.execute(task, task_input)
