-- Transfer activations are bookkeeping with a retention (`BookkeepingRetention::transfer_activations`):
-- the maintenance pass deletes those older than it, a bounded batch at a time, by this index.
-- Migrations run in a transaction, so this is not built CONCURRENTLY: on a server whose table
-- grew for a long time the build holds off activation inserts while it runs. An operator can
-- build it first by hand (`CREATE INDEX CONCURRENTLY transfer_activations_by_age ON
-- transfer_activations (activated_at)`); this migration then finds it and does nothing.
CREATE INDEX IF NOT EXISTS transfer_activations_by_age ON transfer_activations (activated_at);
