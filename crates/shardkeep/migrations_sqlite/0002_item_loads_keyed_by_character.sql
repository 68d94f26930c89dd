-- The item-load ledger keyed by character first, as Postgres migration 0020 keys it (see there
-- for why). SQLite cannot change a primary key in place: the table is rebuilt.
CREATE TABLE item_loads_by_character (
    item_id      BLOB NOT NULL,
    character_id BLOB NOT NULL,
    loaded_epoch INTEGER NOT NULL,
    loaded_at    INTEGER NOT NULL,
    PRIMARY KEY (character_id, item_id)
);
INSERT INTO item_loads_by_character (item_id, character_id, loaded_epoch, loaded_at)
    SELECT item_id, character_id, loaded_epoch, loaded_at FROM item_loads;
DROP TABLE item_loads;
ALTER TABLE item_loads_by_character RENAME TO item_loads;
CREATE INDEX item_loads_by_age ON item_loads (loaded_at);
