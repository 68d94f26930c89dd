-- Claims find their jobs through `persistence_retry_jobs_claimable` (migration 13); nothing reads
-- these two partial indexes any more, and each cost a write on every enqueue, lease and delete.
DROP INDEX IF EXISTS persistence_retry_jobs_due;
DROP INDEX IF EXISTS persistence_retry_jobs_leased;
