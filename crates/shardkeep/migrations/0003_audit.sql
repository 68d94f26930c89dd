-- Accounts and their tier changes, and the append-only audit trail of what permanently happens
-- to characters and accounts.
CREATE TABLE accounts (
    id         UUID PRIMARY KEY,
    tier       TEXT NOT NULL CHECK (tier IN ('player', 'moderator', 'admin')),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE account_role_changes (
    id         UUID PRIMARY KEY,
    account_id UUID NOT NULL REFERENCES accounts (id),
    from_tier  TEXT NOT NULL,
    to_tier    TEXT NOT NULL,
    actor_id   UUID NULL,
    changed_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE character_audit (
    id           UUID PRIMARY KEY,
    seq          BIGINT GENERATED ALWAYS AS IDENTITY,
    subject_type TEXT NOT NULL CHECK (subject_type IN ('character', 'account')),
    subject_id   UUID NOT NULL,
    event_kind   TEXT NOT NULL CHECK (event_kind IN
                     ('created', 'died', 'attribute', 'track', 'item_transferred', 'tier_changed')),
    dedup_key    TEXT NOT NULL CHECK (dedup_key <> ''),
    actor_id     UUID NULL,
    payload      JSONB NOT NULL DEFAULT '{}'::jsonb,
    at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- A retried or at-least-once write can never record an event twice.
    UNIQUE (subject_id, event_kind, dedup_key)
);

-- Newest-first reads of one subject: (at DESC, seq DESC) is true insertion order, even inside
-- one batch whose rows share a transaction's now().
CREATE INDEX character_audit_subject_newest ON character_audit (subject_id, at DESC, seq DESC);
