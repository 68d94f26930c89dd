-- The durable character record: identity, location anchor, one JSONB state document, and the two
-- guards (state_version for contention, owner_epoch for ownership). No per-stat columns.
CREATE TABLE characters (
    id            UUID PRIMARY KEY,
    account_id    UUID NOT NULL,
    name          TEXT NOT NULL CHECK (length(btrim(name)) BETWEEN 1 AND 64),
    zone_ref      TEXT NULL CHECK (zone_ref <> ''),
    room_ref      TEXT NULL,
    state         JSONB NOT NULL DEFAULT '{}'::jsonb,
    chargen       JSONB NULL,
    state_version BIGINT NOT NULL DEFAULT 0 CHECK (state_version >= 0),
    owner_epoch   BIGINT NOT NULL DEFAULT 0 CHECK (owner_epoch >= 0),
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now()
) WITH (fillfactor = 80);

-- Names are unique without regard to case.
CREATE UNIQUE INDEX characters_name_ci ON characters (lower(name));
CREATE INDEX characters_account ON characters (account_id);
