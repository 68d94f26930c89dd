-- Coordination records in the file: what Redis holds beside Postgres (handoffs and consumed
-- markers, presence, the registry, transfer markers, nonces, throttles, resume ledgers, session
-- order marks, console sessions). One row per key, named as the Redis keyspace names it, with an
-- optional expiry in microseconds since the epoch: a row past it is invisible at once and
-- deleted by the maintenance sweep.
CREATE TABLE coord_records (
    key        TEXT PRIMARY KEY,
    value      BLOB NOT NULL,
    expires_at INTEGER NULL
) WITHOUT ROWID;
CREATE INDEX coord_records_by_expiry ON coord_records (expires_at) WHERE expires_at IS NOT NULL;
