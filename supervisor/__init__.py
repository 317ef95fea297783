"""The supervisor: runs a worker node (the worker and the language servers it calls), or the whole system with --dev."""

from supervisor.config import DevConfig, Role, SupervisorConfig
from supervisor.node import EXIT_CONFIG, EXIT_CRASH_LOOP, EXIT_FAILED, EXIT_FORCED, EXIT_OK, Node, Stage

__all__ = [
    "EXIT_CONFIG",
    "EXIT_CRASH_LOOP",
    "EXIT_FAILED",
    "EXIT_FORCED",
    "EXIT_OK",
    "DevConfig",
    "Node",
    "Role",
    "Stage",
    "SupervisorConfig",
]
