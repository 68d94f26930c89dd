-- The owner epoch at which a character's live content last started over from stored state (a
-- login claim loads the row or a checkpoint). A handoff claim continues the lineage: the new
-- copy's content descends from the copy that handed it over. An item released by a copy of the
-- current lineage can safely leave the stored row; one released by an older lineage (a zombie)
-- may be a phantom of what the row still holds.
ALTER TABLE characters ADD COLUMN lineage_epoch BIGINT NOT NULL DEFAULT 0;
