-- Durable work queues in the file (the session journal's queue): what Redis lists hold beside
-- Postgres. An entry is pending while no consumer holds it and is leased oldest first (by its
-- sequence number, which a retried, released or recovered entry keeps, so it goes back in its
-- original order). A consumer's registration carries its incarnation token and heartbeat
-- deadline (microseconds since the epoch); entries held by a consumer past its deadline, or by
-- no registered consumer, are returned by recovery.
CREATE TABLE queue_entries (
    seq    INTEGER PRIMARY KEY AUTOINCREMENT,
    queue  TEXT NOT NULL,
    body   BLOB NOT NULL,
    holder TEXT NULL
);
CREATE INDEX queue_entries_pending ON queue_entries (queue, seq) WHERE holder IS NULL;
CREATE INDEX queue_entries_held ON queue_entries (queue, holder, seq) WHERE holder IS NOT NULL;

CREATE TABLE queue_consumers (
    queue      TEXT NOT NULL,
    id         TEXT NOT NULL,
    token      TEXT NOT NULL,
    beat_until INTEGER NOT NULL,
    PRIMARY KEY (queue, id)
) WITHOUT ROWID;

-- Dead letters, newest last by sequence number; `dead_letter_id` is the record's own id
-- (16-byte BLOB), `failed_at` its failure time for retention.
CREATE TABLE queue_dead_letters (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    queue          TEXT NOT NULL,
    dead_letter_id BLOB NOT NULL,
    body           BLOB NOT NULL,
    failed_at      INTEGER NOT NULL
);
CREATE UNIQUE INDEX queue_dead_letters_by_id ON queue_dead_letters (queue, dead_letter_id);
CREATE INDEX queue_dead_letters_by_seq ON queue_dead_letters (queue, seq);
