-- Every primary key includes the column its table is distributed by in the scaling plan
-- (docs/scaling.md): the character for its jobs, dead letters and transfer activations, the
-- subject for the audit trail, the account for its role changes. A sharded Postgres (Citus)
-- requires that of every primary key and unique constraint. Lookups by id alone keep a plain
-- index of their own.
ALTER TABLE persistence_retry_jobs
    DROP CONSTRAINT persistence_retry_jobs_pkey,
    ADD PRIMARY KEY (character_id, retry_job_id);
CREATE INDEX persistence_retry_jobs_id ON persistence_retry_jobs (retry_job_id);
-- The primary key now leads with the character: the index on it alone is redundant.
DROP INDEX persistence_retry_jobs_character;

ALTER TABLE persistence_job_dead_letters
    DROP CONSTRAINT persistence_job_dead_letters_pkey,
    ADD PRIMARY KEY (character_id, dead_letter_id);
CREATE INDEX persistence_job_dead_letters_id ON persistence_job_dead_letters (dead_letter_id);

ALTER TABLE transfer_activations
    DROP CONSTRAINT transfer_activations_pkey,
    ADD PRIMARY KEY (character_id, transfer_token);

ALTER TABLE character_audit
    DROP CONSTRAINT character_audit_pkey,
    ADD PRIMARY KEY (subject_id, id);

ALTER TABLE account_role_changes
    DROP CONSTRAINT account_role_changes_pkey,
    ADD PRIMARY KEY (account_id, id);
