-- The embedded store's schema: every table of the Postgres schema (migrations/ up to 0018) in
-- one SQLite file, with the same names, keys and checks. Differences, all of representation:
-- ids are 16-byte BLOBs (sqlx's encoding of a UUID), JSON documents are TEXT, every instant is
-- INTEGER microseconds since the Unix epoch (compared as numbers), and names are unique by a
-- key the store folds in Rust (`name_key`: SQLite's lower() folds ASCII only).

CREATE TABLE characters (
    id                     BLOB PRIMARY KEY,
    account_id             BLOB NOT NULL,
    name                   TEXT NOT NULL CHECK (length(trim(name)) BETWEEN 1 AND 64),
    name_key               TEXT NOT NULL,
    zone_ref               TEXT NULL CHECK (zone_ref <> ''),
    room_ref               TEXT NULL,
    state                  TEXT NOT NULL DEFAULT '{}',
    chargen                TEXT NULL,
    state_version          INTEGER NOT NULL DEFAULT 0 CHECK (state_version >= 0),
    owner_epoch            INTEGER NOT NULL DEFAULT 0 CHECK (owner_epoch >= 0),
    created_at             INTEGER NOT NULL,
    updated_at             INTEGER NOT NULL,
    lineage_epoch          INTEGER NOT NULL DEFAULT 0,
    live_version           INTEGER NOT NULL DEFAULT 0,
    handoff_claim          TEXT NULL,
    journal_location_epoch INTEGER NULL,
    journal_location_at    INTEGER NULL,
    live_issue_epoch       INTEGER NOT NULL DEFAULT 0,
    live_issue_mark        INTEGER NOT NULL DEFAULT 0 CHECK (live_issue_mark >= 0),
    schema_version         INTEGER NOT NULL DEFAULT 1 CHECK (schema_version >= 1),
    owner_schema_version   INTEGER NOT NULL DEFAULT 1 CHECK (owner_schema_version >= 1)
);
CREATE UNIQUE INDEX characters_name_ci ON characters (name_key);
CREATE INDEX characters_account ON characters (account_id);

CREATE TABLE persistence_retry_jobs (
    retry_job_id     BLOB NOT NULL,
    job_kind         TEXT NOT NULL,
    character_id     BLOB NOT NULL,
    realm_id         TEXT NULL,
    zone_id          TEXT NULL,
    payload          TEXT NOT NULL,
    last_error       TEXT NULL,
    attempt_count    INTEGER NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
    next_attempt_at  INTEGER NOT NULL,
    lease_token      BLOB NULL,
    lease_owner      TEXT NULL,
    lease_expires_at INTEGER NULL,
    session_token    TEXT NULL,
    session_impact   TEXT NOT NULL,
    source           TEXT NOT NULL,
    idempotency_key  TEXT NOT NULL,
    owner_epoch      INTEGER NOT NULL,
    origin           TEXT NOT NULL,
    issued_at        INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    issue_seq        INTEGER NOT NULL DEFAULT 0 CHECK (issue_seq >= 0),
    lease_expiries   INTEGER NOT NULL DEFAULT 0 CHECK (lease_expiries >= 0),
    CHECK ((lease_token IS NULL) = (lease_expires_at IS NULL)),
    PRIMARY KEY (character_id, retry_job_id)
);
CREATE INDEX persistence_retry_jobs_id ON persistence_retry_jobs (retry_job_id);
-- When a job can be claimed: its next attempt, or after its lease too while one is held.
CREATE INDEX persistence_retry_jobs_claimable ON persistence_retry_jobs (
    CASE WHEN lease_token IS NULL THEN next_attempt_at
         ELSE max(next_attempt_at, lease_expires_at) END,
    created_at
);
CREATE INDEX persistence_retry_jobs_leased_count ON persistence_retry_jobs (lease_expires_at)
    WHERE lease_token IS NOT NULL;

CREATE TABLE persistence_job_dead_letters (
    dead_letter_id        BLOB NOT NULL,
    retry_job_id          BLOB NOT NULL,
    job_kind              TEXT NOT NULL,
    character_id          BLOB NOT NULL,
    realm_id              TEXT NULL,
    zone_id               TEXT NULL,
    payload               TEXT NOT NULL,
    failed_attempts       INTEGER NOT NULL,
    last_error            TEXT NOT NULL,
    failed_at             INTEGER NOT NULL,
    session_token         TEXT NULL,
    source                TEXT NOT NULL,
    session_impact        TEXT NOT NULL,
    idempotency_key       TEXT NOT NULL,
    owner_epoch           INTEGER NOT NULL,
    origin                TEXT NOT NULL,
    issued_at             INTEGER NOT NULL,
    requeued_at           INTEGER NULL,
    requeued_retry_job_id BLOB NULL,
    issue_seq             INTEGER NOT NULL DEFAULT 0 CHECK (issue_seq >= 0),
    PRIMARY KEY (character_id, dead_letter_id)
);
CREATE INDEX persistence_job_dead_letters_id ON persistence_job_dead_letters (dead_letter_id);
CREATE INDEX persistence_job_dead_letters_active ON persistence_job_dead_letters (failed_at DESC)
    WHERE requeued_at IS NULL;
CREATE INDEX persistence_job_dead_letters_character
    ON persistence_job_dead_letters (character_id, failed_at DESC) WHERE requeued_at IS NULL;
CREATE INDEX persistence_job_dead_letters_failed_at
    ON persistence_job_dead_letters (failed_at, dead_letter_id);

CREATE TABLE transfer_activations (
    transfer_token TEXT NOT NULL,
    character_id   BLOB NOT NULL,
    target_shard   TEXT NOT NULL,
    target_zone    TEXT NOT NULL,
    owner_epoch    INTEGER NOT NULL,
    activated_at   INTEGER NOT NULL,
    PRIMARY KEY (character_id, transfer_token)
);
CREATE INDEX transfer_activations_by_age ON transfer_activations (activated_at);

CREATE TABLE accounts (
    id         BLOB PRIMARY KEY,
    tier       TEXT NOT NULL CHECK (tier IN ('player', 'moderator', 'admin')),
    created_at INTEGER NOT NULL
);

CREATE TABLE account_role_changes (
    id         BLOB NOT NULL,
    account_id BLOB NOT NULL REFERENCES accounts (id),
    from_tier  TEXT NOT NULL,
    to_tier    TEXT NOT NULL,
    actor_id   BLOB NULL,
    changed_at INTEGER NOT NULL,
    PRIMARY KEY (account_id, id)
);

-- `seq` is the rowid: the true insertion order.
CREATE TABLE character_audit (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    id           BLOB NOT NULL,
    subject_type TEXT NOT NULL CHECK (subject_type IN ('character', 'account')),
    subject_id   BLOB NOT NULL,
    event_kind   TEXT NOT NULL CHECK (event_kind IN ('created', 'died', 'attribute', 'track',
                                                      'item_transferred', 'tier_changed')),
    dedup_key    TEXT NOT NULL CHECK (dedup_key <> ''),
    actor_id     BLOB NULL,
    payload      TEXT NOT NULL DEFAULT '{}',
    at           INTEGER NOT NULL,
    UNIQUE (subject_id, id),
    UNIQUE (subject_id, event_kind, dedup_key)
);
CREATE INDEX character_audit_subject_newest ON character_audit (subject_id, at DESC, seq DESC);

CREATE TABLE character_job_effects (
    character_id    BLOB NOT NULL,
    idempotency_key TEXT NOT NULL,
    owner_epoch     INTEGER NOT NULL,
    issue_seq       INTEGER NOT NULL CHECK (issue_seq >= 0),
    job_kind        TEXT NOT NULL,
    payload         TEXT NULL,
    row_version     INTEGER NOT NULL,
    applied_order   INTEGER NOT NULL,
    applied_at      INTEGER NOT NULL,
    PRIMARY KEY (character_id, idempotency_key)
);
CREATE INDEX character_job_effects_unsequenced_by_age ON character_job_effects (applied_at)
    WHERE issue_seq = 0;

CREATE TABLE item_loads (
    item_id      BLOB NOT NULL,
    character_id BLOB NOT NULL,
    loaded_epoch INTEGER NOT NULL,
    loaded_at    INTEGER NOT NULL,
    PRIMARY KEY (item_id, character_id)
);
CREATE INDEX item_loads_by_age ON item_loads (loaded_at);

CREATE TABLE item_releases (
    character_id   BLOB NOT NULL,
    item_id        BLOB NOT NULL,
    released_epoch INTEGER NOT NULL,
    released_at    INTEGER NOT NULL,
    PRIMARY KEY (character_id, item_id)
);
CREATE INDEX item_releases_by_age ON item_releases (released_at);

-- The checkpoint tier, in the file: one snapshot per character with the owner epoch and schema
-- of the copy that wrote it (the guard a write checks), expiring like the Redis tier's.
CREATE TABLE checkpoints (
    character_id BLOB PRIMARY KEY,
    owner_epoch  INTEGER NOT NULL,
    schema       INTEGER NOT NULL,
    snapshot     TEXT NOT NULL,
    expires_at   INTEGER NOT NULL
);
CREATE INDEX checkpoints_by_expiry ON checkpoints (expires_at);
