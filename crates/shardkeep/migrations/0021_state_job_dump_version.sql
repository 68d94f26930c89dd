-- The row version a state job's dump was made at (its copy's last known version). A settle that
-- applies the dump plays on it every effect the row took after that version and the dump does
-- not hold (an offline grant that landed while the job waited), so the dump does not wipe them.
-- NULL for every other job, and for state jobs stored before this column (they apply as before).
ALTER TABLE persistence_retry_jobs ADD COLUMN dumped_at_version BIGINT;
ALTER TABLE persistence_job_dead_letters ADD COLUMN dumped_at_version BIGINT;
