"""The coordinator: workflow state in PostgreSQL, task leases, the state machine and the outbox relay."""
