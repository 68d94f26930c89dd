-- Where the last location written by a session cleanup (the journal) stands in its character's
-- order: the epoch of the copy whose stream closed, then when it closed. A cleanup that is not
-- newer than this, or that finds a live write of a newer state than its copy knew
-- (live_version), leaves the location alone: retries and recoveries can deliver cleanups in
-- any order without rewriting an older location.
ALTER TABLE characters
    ADD COLUMN journal_location_epoch BIGINT NULL,
    ADD COLUMN journal_location_at TIMESTAMPTZ NULL;
