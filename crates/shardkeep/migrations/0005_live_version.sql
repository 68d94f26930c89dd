-- The state_version right after the last write by a live copy (a flush, a final save, a transfer
-- commit). Retry jobs, journal location writes and item takes move state_version but not this:
-- a checkpoint dumped at or after it holds newer live content than the row, and the loader then
-- replays the row's job effects on top of it.
ALTER TABLE characters ADD COLUMN live_version BIGINT NOT NULL DEFAULT 0;
