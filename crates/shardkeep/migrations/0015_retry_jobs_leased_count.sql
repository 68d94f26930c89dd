-- The depth gauges count leased jobs through this index: only jobs claimed under a lease (a
-- worker's cautious first poll, a fallback after a failed batch) enter it, so a job claimed the
-- usual way — its row lock is its lease — never writes to it, and the count reads a handful of
-- entries however large the queue is.
CREATE INDEX IF NOT EXISTS persistence_retry_jobs_leased_count
    ON persistence_retry_jobs (lease_expires_at)
    WHERE lease_token IS NOT NULL;
