-- The game's schema version of the state document a row holds. A process whose model is older
-- than a row's version neither loads it for play nor writes over it (the save fences it in the
-- same statement as the epoch and the row version). Rows written before this column were the
-- game's first version.
ALTER TABLE characters
    ADD COLUMN schema_version INTEGER NOT NULL DEFAULT 1 CHECK (schema_version >= 1);
