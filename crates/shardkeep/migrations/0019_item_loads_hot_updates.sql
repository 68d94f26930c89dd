-- The item-load ledger is rewritten on every load of a character, for every item it holds.
-- Those updates now leave the indexed load time alone unless it is stale (heap-only updates:
-- no new index entries); room on each page lets them stay on it.
ALTER TABLE item_loads SET (fillfactor = 70);
