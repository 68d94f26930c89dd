-- Durable retry jobs for writes that could not finish synchronously, and their dead letters.
CREATE TABLE persistence_retry_jobs (
    retry_job_id     UUID PRIMARY KEY,
    job_kind         TEXT NOT NULL,
    character_id     UUID NOT NULL,
    realm_id         TEXT NULL,
    zone_id          TEXT NULL,
    payload          JSONB NOT NULL,
    last_error       TEXT NULL,
    attempt_count    INTEGER NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
    next_attempt_at  TIMESTAMPTZ NOT NULL,
    lease_token      UUID NULL,
    lease_owner      TEXT NULL,
    lease_expires_at TIMESTAMPTZ NULL,
    session_token    TEXT NULL,
    session_impact   TEXT NOT NULL,
    source           TEXT NOT NULL,
    idempotency_key  TEXT NOT NULL,
    owner_epoch      BIGINT NOT NULL,
    origin           TEXT NOT NULL,
    issued_at        TIMESTAMPTZ NOT NULL,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK ((lease_token IS NULL) = (lease_expires_at IS NULL))
) WITH (
    -- Rows are inserted, leased (updated) and deleted within seconds: leave room for HOT
    -- updates and vacuum early and often.
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 500,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);

-- The due query reads only unleased rows through this index; leased rows never enter it.
CREATE INDEX persistence_retry_jobs_due
    ON persistence_retry_jobs (next_attempt_at, created_at)
    WHERE lease_token IS NULL;

-- Leases left behind by a dead worker, found by expiry.
CREATE INDEX persistence_retry_jobs_leased
    ON persistence_retry_jobs (lease_expires_at)
    WHERE lease_token IS NOT NULL;

CREATE TABLE persistence_job_dead_letters (
    dead_letter_id        UUID PRIMARY KEY,
    retry_job_id          UUID NOT NULL,
    job_kind              TEXT NOT NULL,
    character_id          UUID NOT NULL,
    realm_id              TEXT NULL,
    zone_id               TEXT NULL,
    payload               JSONB NOT NULL,
    failed_attempts       INTEGER NOT NULL,
    last_error            TEXT NOT NULL,
    failed_at             TIMESTAMPTZ NOT NULL,
    session_token         TEXT NULL,
    source                TEXT NOT NULL,
    session_impact        TEXT NOT NULL,
    idempotency_key       TEXT NOT NULL,
    owner_epoch           BIGINT NOT NULL,
    origin                TEXT NOT NULL,
    issued_at             TIMESTAMPTZ NOT NULL,
    requeued_at           TIMESTAMPTZ NULL,
    requeued_retry_job_id UUID NULL
);

-- Operators list active dead letters newest first.
CREATE INDEX persistence_job_dead_letters_active
    ON persistence_job_dead_letters (failed_at DESC)
    WHERE requeued_at IS NULL;

-- Reward grants applied, by idempotency key: a job executed twice grants once.
CREATE TABLE reward_grants (
    idempotency_key TEXT PRIMARY KEY,
    character_id    UUID NOT NULL,
    retry_job_id    UUID NULL,
    granted_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Transfer activations recorded durably.
CREATE TABLE transfer_activations (
    transfer_token TEXT PRIMARY KEY,
    character_id   UUID NOT NULL,
    target_shard   TEXT NOT NULL,
    target_zone    TEXT NOT NULL,
    owner_epoch    BIGINT NOT NULL,
    activated_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
