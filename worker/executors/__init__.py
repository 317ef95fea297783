"""Executors: the executor contract and the built-in HTTP executor."""

from worker.executors.executor import ExecutionResult, Executor, TaskContext
from worker.executors.http import HTTPExecutor, normalize_response_body

__all__ = ["ExecutionResult", "Executor", "HTTPExecutor", "TaskContext", "normalize_response_body"]
