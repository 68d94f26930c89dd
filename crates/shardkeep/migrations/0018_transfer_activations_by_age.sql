-- Transfer activations are bookkeeping with a retention (`BookkeepingRetention::transfer_activations`):
-- the maintenance pass deletes those older than it, a bounded batch at a time, by this index.
CREATE INDEX transfer_activations_by_age ON transfer_activations (activated_at);
