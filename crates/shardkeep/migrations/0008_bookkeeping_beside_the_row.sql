-- shardkeep's bookkeeping leaves the game's state document. Three lists used to live inside
-- `characters.state` and grew with a character's age (reward keys, retry-job effects to replay,
-- items held at each load); they now live beside the row, bounded by marks and pruned.

-- The issue mark of the content the row holds: the copy at `live_issue_epoch` had issued every
-- reward and retry job up to sequence `live_issue_mark` when it dumped that content (a live save,
-- or a state job carrying a dump). A job of that copy at or below the mark is already in the row.
ALTER TABLE characters
    ADD COLUMN live_issue_epoch BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN live_issue_mark  BIGINT NOT NULL DEFAULT 0 CHECK (live_issue_mark >= 0);

-- A retry job's place in its issuing copy's sequence (0: not sequenced), kept through dead letters.
ALTER TABLE persistence_retry_jobs
    ADD COLUMN issue_seq BIGINT NOT NULL DEFAULT 0 CHECK (issue_seq >= 0);
ALTER TABLE persistence_job_dead_letters
    ADD COLUMN issue_seq BIGINT NOT NULL DEFAULT 0 CHECK (issue_seq >= 0);

-- Retry-job effects applied to a row, keyed by the job's idempotency key: a job stored twice is
-- applied once, and a loader that prefers a newer checkpoint replays the ones it does not hold.
-- `payload` is NULL for a key kept only to refuse a second grant (reward keys carried over from
-- the old state documents). Rows are pruned once a live write holds them or a newer owner took
-- the character, and after a retention for the unsequenced ones.
CREATE TABLE character_job_effects (
    character_id    UUID NOT NULL,
    idempotency_key TEXT NOT NULL,
    owner_epoch     BIGINT NOT NULL,
    issue_seq       BIGINT NOT NULL CHECK (issue_seq >= 0),
    job_kind        TEXT NOT NULL,
    payload         JSONB NULL,
    row_version     BIGINT NOT NULL,
    applied_order   BIGINT GENERATED ALWAYS AS IDENTITY,
    applied_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (character_id, idempotency_key)
) WITH (fillfactor = 90, autovacuum_vacuum_scale_factor = 0.02);

-- Per-character reads go through the primary key's leading column (a character has few rows:
-- those no live write has superseded yet). Only unsequenced rows are pruned by age.
CREATE INDEX character_job_effects_unsequenced_by_age
    ON character_job_effects (applied_at) WHERE issue_seq = 0;

-- The item-load ledger: the highest owner epoch of a copy of `character_id` that started out
-- holding `item_id`. A floor copy of the item released by an earlier copy of that character is a
-- phantom (a crash rolled the release back) and must not enter another row. One row per item and
-- character, refreshed at each load, pruned after a retention.
CREATE TABLE item_loads (
    item_id      UUID NOT NULL,
    character_id UUID NOT NULL,
    loaded_epoch BIGINT NOT NULL,
    loaded_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (item_id, character_id)
);

CREATE INDEX item_loads_by_age ON item_loads (loaded_at);

-- Carry the old fields forward, then drop them from the documents.
INSERT INTO character_job_effects
       (character_id, idempotency_key, owner_epoch, issue_seq, job_kind, payload, row_version)
SELECT c.id, e.value->>'key', c.owner_epoch, 0,
       COALESCE(e.value->'payload'->>'kind', 'unknown'), e.value->'payload', c.state_version
  FROM characters c
 CROSS JOIN LATERAL jsonb_array_elements(
           CASE WHEN jsonb_typeof(c.state->'job_effects') = 'array'
                THEN c.state->'job_effects' ELSE '[]'::jsonb END) WITH ORDINALITY AS e(value, n)
 WHERE jsonb_typeof(e.value->'key') = 'string'
 ORDER BY c.id, e.n
    ON CONFLICT DO NOTHING;

INSERT INTO character_job_effects
       (character_id, idempotency_key, owner_epoch, issue_seq, job_kind, payload, row_version)
SELECT c.id, k.key, c.owner_epoch, 0, 'combat_rewards', NULL, c.state_version
  FROM characters c
 CROSS JOIN LATERAL jsonb_array_elements_text(
           CASE WHEN jsonb_typeof(c.state->'reward_keys') = 'array'
                THEN c.state->'reward_keys' ELSE '[]'::jsonb END) AS k(key)
 WHERE k.key IS NOT NULL
    ON CONFLICT DO NOTHING;

INSERT INTO character_job_effects
       (character_id, idempotency_key, owner_epoch, issue_seq, job_kind, payload, row_version)
SELECT g.character_id, g.idempotency_key, COALESCE(c.owner_epoch, 0), 0, 'combat_rewards', NULL,
       COALESCE(c.state_version, 0)
  FROM reward_grants g LEFT JOIN characters c ON c.id = g.character_id
 -- A grant recorded for a job that did not apply (still pending, or dead-lettered and not yet
 -- requeued: the key used to be committed even when the apply failed) is not carried over, so
 -- that job still grants when it runs.
 WHERE NOT EXISTS (SELECT 1 FROM persistence_retry_jobs j WHERE j.retry_job_id = g.retry_job_id)
   AND NOT EXISTS (SELECT 1 FROM persistence_job_dead_letters d
                    WHERE d.retry_job_id = g.retry_job_id AND d.requeued_at IS NULL)
   -- ...nor one whose dead letter was requeued (under a new job id) and is pending again.
   AND NOT EXISTS (SELECT 1 FROM persistence_job_dead_letters d
                     JOIN persistence_retry_jobs j
                       ON j.character_id = d.character_id AND j.idempotency_key = d.idempotency_key
                    WHERE d.character_id = g.character_id AND d.idempotency_key = g.idempotency_key
                      AND d.requeued_at IS NOT NULL)
    ON CONFLICT DO NOTHING;

DROP TABLE reward_grants;

INSERT INTO item_loads (item_id, character_id, loaded_epoch)
SELECT h.key::uuid, c.id, max(h.value::bigint)
  FROM characters c
 CROSS JOIN LATERAL jsonb_each_text(
           CASE WHEN jsonb_typeof(c.state->'held_at_load') = 'object'
                THEN c.state->'held_at_load' ELSE '{}'::jsonb END) AS h(key, value)
 WHERE h.key ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
   AND h.value ~ '^[0-9]{1,18}$'
 GROUP BY h.key, c.id
    ON CONFLICT DO NOTHING;

UPDATE characters
   SET state = state - 'reward_keys' - 'job_effects' - 'held_at_load'
 WHERE jsonb_typeof(state) = 'object' AND state ?| ARRAY['reward_keys', 'job_effects', 'held_at_load'];
