-- The item-release ledger: an item a transfer commit took from `character_id`, at the owner epoch
-- of the copy that released it. A job of that character that adds the item again afterwards (a
-- fight's loot or a dump issued before the release, applied only after the commit) leaves it
-- out: the item is in the acquirer's row now. A transfer back to the character deletes the row.
-- Pruned with the item-load ledger, after the same retention.
CREATE TABLE item_releases (
    character_id   UUID NOT NULL,
    item_id        UUID NOT NULL,
    released_epoch BIGINT NOT NULL,
    released_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (character_id, item_id)
);

CREATE INDEX item_releases_by_age ON item_releases (released_at);
