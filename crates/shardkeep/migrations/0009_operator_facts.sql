-- Leases that ran out: a job that crashes or hangs the worker holding it never settles, so its
-- attempts never grow; this count does, and past a limit the job is dead-lettered.
ALTER TABLE persistence_retry_jobs
    ADD COLUMN lease_expiries INTEGER NOT NULL DEFAULT 0 CHECK (lease_expiries >= 0);

-- Dead-letter retention prunes the oldest first, requeued or not.
CREATE INDEX persistence_job_dead_letters_failed_at
    ON persistence_job_dead_letters (failed_at, dead_letter_id);

-- Operators filter dead letters by character.
CREATE INDEX persistence_job_dead_letters_character
    ON persistence_job_dead_letters (character_id, failed_at DESC)
    WHERE requeued_at IS NULL;
