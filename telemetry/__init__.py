"""Cross-cutting runtime plumbing every service shares: structured logging.

Kept apart from the service packages so that none of them imports another's
internals; it depends on nothing of ours.
"""

from telemetry.logs import configure_logging, redact_url

__all__ = ["configure_logging", "redact_url"]
