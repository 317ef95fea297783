"""The supervisor: runs a worker node (the worker loop and the language servers it calls)."""
