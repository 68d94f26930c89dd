-- The row version a state job's dump was made at: see the Postgres migration 21.
ALTER TABLE persistence_retry_jobs ADD COLUMN dumped_at_version INTEGER;
ALTER TABLE persistence_job_dead_letters ADD COLUMN dumped_at_version INTEGER;
