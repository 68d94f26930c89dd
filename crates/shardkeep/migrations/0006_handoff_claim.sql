-- The token of the handoff whose claim minted the current owner epoch and adopted the snapshot it
-- carried (NULL after a login claim, or a handoff claim that was refused). A handoff is adopted
-- only when the copy that dumped its snapshot still owns the row; a claim of the same handoff
-- retried after its reply was lost finds its own token here and is adopted again, while a login
-- elsewhere in between clears it and the retry is refused.
ALTER TABLE characters ADD COLUMN handoff_claim TEXT NULL;
