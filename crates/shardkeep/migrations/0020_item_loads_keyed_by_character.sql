-- The item-load ledger's primary key leads with the character instead of the item.
--
-- Item ids are time-ordered (UUIDv7), so with the item first every new item's entries went to the
-- right edge of the index, while the entries of items a character kept for a long time stayed
-- scattered over pages covering the whole of the server's history. The prune empties most of an
-- old page but rarely all of it, and a B-tree only gives back pages that are wholly empty: the
-- index grew with the server's age while its rows did not. Keyed by character first, a
-- character's entries share a page or two that its next loads and prunes reuse, so the index
-- follows the number of entries. Every lookup names both columns, so no query changes.
--
-- Migrations run in a transaction, and the rebuild locks the ledger against reads and writes
-- until they commit (it holds one entry per item and character loaded within the retention):
-- transfer commits wait and loads record no entries meanwhile, so run it before starting shards.
-- Waiting more than 10 s for the lock (a long transaction or a manual VACUUM holding the table)
-- fails the migration instead of queueing every ledger reader behind it; run it again then.
SET LOCAL lock_timeout = '10s';
ALTER TABLE item_loads
    DROP CONSTRAINT item_loads_pkey,
    ADD CONSTRAINT item_loads_pkey PRIMARY KEY (character_id, item_id);
