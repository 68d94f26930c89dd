-- The schema version of the model of the copy that holds the row's current epoch, set by every
-- claim. A copy writes checkpoints and hands its character off in its own model's schema, so a
-- process whose model is older than the owner's refuses the claim in the same statement: it
-- could not read what that owner may have written anywhere, and minting an epoch it cannot use
-- would bury that owner's newest checkpoint. Rows claimed before this column: their document's
-- schema.
ALTER TABLE characters
    ADD COLUMN owner_schema_version INTEGER NOT NULL DEFAULT 1 CHECK (owner_schema_version >= 1);
UPDATE characters SET owner_schema_version = schema_version WHERE schema_version > 1;
