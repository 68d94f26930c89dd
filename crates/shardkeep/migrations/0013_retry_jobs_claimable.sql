-- When a job can next be claimed: when it is due, and, while a lease is on it, not before the
-- lease runs out. The claim filters and orders by this one expression, so it walks this index
-- from the oldest claimable job and stops at the first not yet claimable, however many jobs wait
-- for later (the claim's former `lease_token IS NULL OR lease_expires_at <= now` matched neither
-- partial index: every poll scanned and sorted the whole queue).
CREATE INDEX persistence_retry_jobs_claimable ON persistence_retry_jobs (
    (CASE WHEN lease_token IS NULL THEN next_attempt_at
          ELSE GREATEST(next_attempt_at, COALESCE(lease_expires_at, 'infinity')) END),
    created_at
);
