-- A claim settles the jobs still pending for the character it claims (its predecessor's
-- acknowledged writes) before it mints the new epoch: it finds them by character.
CREATE INDEX persistence_retry_jobs_character ON persistence_retry_jobs (character_id);
