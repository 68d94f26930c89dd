-- Recount one processing list (after a BLMOVE, which no script can wrap).
-- KEYS[1] processing list, KEYS[2] held counts, KEYS[3] held total; ARGV[1] consumer id
-- Reply: entries the list holds
return recount(KEYS[1], KEYS[2], KEYS[3], ARGV[1])
