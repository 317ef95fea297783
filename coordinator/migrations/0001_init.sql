-- The coordinator's schema. Workflow state lives here; Redis only carries
-- dispatches, which can always be re-created from these tables.

CREATE TABLE workflows (
    name        text        NOT NULL,
    version     integer     NOT NULL CHECK (version > 0),
    definition  jsonb       NOT NULL,
    digest      text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, version)
);

CREATE TABLE runs (
    id               uuid        PRIMARY KEY,
    workflow         text        NOT NULL,
    version          integer     NOT NULL,
    state            text        NOT NULL CHECK (state IN ('RUNNING', 'COMPLETED', 'FAILED', 'CANCELLED')),
    input            jsonb       NOT NULL,
    output           jsonb,
    error            text,
    idempotency_key  text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    FOREIGN KEY (workflow, version) REFERENCES workflows (name, version)
);
CREATE UNIQUE INDEX runs_idempotency_key ON runs (workflow, idempotency_key) WHERE idempotency_key IS NOT NULL;

-- One row per node of a run. Attempts reuse the row (attempt is the fencing
-- token), so the task id is stable across retries: it is the idempotency key
-- handed to the outside world. Hash-partitioned by run_id: every per-task
-- statement names run_id and touches one partition.
CREATE TABLE task_instances (
    run_id            uuid        NOT NULL,
    id                uuid        NOT NULL,
    node_id           text        NOT NULL,
    node_type         text        NOT NULL,
    queue             text,
    state             text        NOT NULL CHECK (state IN ('PENDING', 'QUEUED', 'RUNNING', 'COMPLETED', 'FAILED', 'SKIPPED')),
    attempt           integer     NOT NULL DEFAULT 0,
    max_attempts      integer     NOT NULL,
    input             jsonb,
    output            jsonb,
    error             text,
    lease_owner       text,
    lease_expires_at  timestamptz,
    next_attempt_at   timestamptz,
    -- Where the current attempt's latest dispatch went (set by the relay), so
    -- the sweeper can ask Redis whether that message still exists.
    dispatch_stream   text,
    dispatch_id       text,
    dispatched_at     timestamptz,
    swept_at          timestamptz,
    started_at        timestamptz,
    finished_at       timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, id),
    UNIQUE (run_id, node_id)
) PARTITION BY HASH (run_id);

DO $$
BEGIN
    FOR i IN 0..15 LOOP
        EXECUTE format(
            'CREATE TABLE task_instances_p%s PARTITION OF task_instances FOR VALUES WITH (MODULUS 16, REMAINDER %s)',
            i, i);
    END LOOP;
END
$$;

-- The sweeper's scans: tasks that may have stalled.
CREATE INDEX task_instances_running_lease ON task_instances (lease_expires_at) WHERE state = 'RUNNING';
CREATE INDEX task_instances_queued ON task_instances (updated_at) WHERE state = 'QUEUED';

-- Messages to publish to Redis, written in the same transaction as the state
-- change that caused them. available_at carries retry backoff.
CREATE TABLE outbox (
    id            bigserial   PRIMARY KEY,
    stream        text        NOT NULL,
    payload       text        NOT NULL,
    run_id        uuid        NOT NULL,
    task_id       uuid        NOT NULL,
    attempt       integer     NOT NULL,
    available_at  timestamptz NOT NULL DEFAULT now(),
    published_at  timestamptz,
    stream_id     text,
    created_at    timestamptz NOT NULL DEFAULT now()
);
-- The relay's scan: due, unpublished rows in order.
CREATE INDEX outbox_due ON outbox (available_at, id) WHERE published_at IS NULL;
-- Retention of published rows.
CREATE INDEX outbox_published ON outbox (published_at) WHERE published_at IS NOT NULL;
CREATE INDEX outbox_task ON outbox (run_id, task_id, attempt) WHERE published_at IS NULL;

-- Reports the coordinator acknowledged but did not apply (stale attempt, not
-- the lease owner, task already finished): kept for operators.
CREATE TABLE ignored_reports (
    id          bigserial   PRIMARY KEY,
    run_id      uuid        NOT NULL,
    task_id     uuid        NOT NULL,
    attempt     integer     NOT NULL,
    owner       text        NOT NULL,
    status      text        NOT NULL,
    reason      text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ignored_reports_run ON ignored_reports (run_id, id);

-- Tasks whose message was delivered more than MaxDeliveries times.
CREATE TABLE dead_letters (
    id              bigserial   PRIMARY KEY,
    run_id          uuid        NOT NULL,
    task_id         uuid        NOT NULL,
    node_id         text        NOT NULL,
    attempt         integer     NOT NULL,
    delivery_count  bigint      NOT NULL,
    reported_by     text        NOT NULL,
    reason          text        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX dead_letters_run ON dead_letters (run_id, id);
