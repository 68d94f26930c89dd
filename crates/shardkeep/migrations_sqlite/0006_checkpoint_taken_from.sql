-- The guard a take-over replaced, kept beside the checkpoint: a loader that repeats its
-- take-over (its first answer lost) is told the guard found the first time, not its own.
ALTER TABLE checkpoints ADD COLUMN taken_from INTEGER;
