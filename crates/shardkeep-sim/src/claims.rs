//! Every ownership claim the simulator saw land, and the invariant over them: a handoff is
//! adopted only when the copy that dumped its snapshot still owned the character, so no epoch
//! minted for anyone else lies between the handoff's dumped epoch and the epoch its claim minted.

use std::collections::HashMap;

use uuid::Uuid;

use super::report::Invariant;

/// One claim that landed (its reply arrived).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ClaimRecord {
    pub(super) character_id: Uuid,
    /// The epoch the claim minted.
    pub(super) minted: i64,
    /// For a handoff: its token, the epoch its snapshot was dumped under, and whether the
    /// carried content was adopted.
    pub(super) handoff: Option<HandoffClaimRecord>,
}

/// What a handoff claim said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct HandoffClaimRecord {
    pub(super) token: String,
    pub(super) dumped_under: i64,
    pub(super) adopted: bool,
}

/// No superseded handoff adopted: for every adopted handoff, each other claim of the same
/// character minted an epoch outside `(dumped_under, minted)`: nobody claimed the character
/// between the dumping copy and the destination, except this very handoff's own retries.
pub(super) fn no_superseded_handoff_adopted(claims: &[ClaimRecord]) -> Invariant {
    let mut by_character: HashMap<Uuid, Vec<&ClaimRecord>> = HashMap::new();
    for claim in claims {
        by_character
            .entry(claim.character_id)
            .or_default()
            .push(claim);
    }
    let mut checked = 0;
    let mut details = Vec::new();
    for claim in claims {
        let Some(handoff) = claim.handoff.as_ref().filter(|h| h.adopted) else {
            continue;
        };
        checked += 1;
        let others = by_character.get(&claim.character_id).into_iter().flatten();
        for other in others {
            let same_handoff = other
                .handoff
                .as_ref()
                .is_some_and(|h| h.token == handoff.token);
            if !same_handoff && other.minted > handoff.dumped_under && other.minted < claim.minted {
                details.push(format!(
                    "{}: handoff {} dumped under epoch {} was adopted at epoch {}, but epoch {} \
                     was claimed in between",
                    claim.character_id,
                    handoff.token,
                    handoff.dumped_under,
                    claim.minted,
                    other.minted
                ));
            }
        }
    }
    Invariant::new("no superseded handoff adopted", checked, details)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn login(epoch: i64) -> ClaimRecord {
        ClaimRecord {
            character_id: Uuid::nil(),
            minted: epoch,
            handoff: None,
        }
    }

    fn handoff(token: &str, dumped: i64, minted: i64, adopted: bool) -> ClaimRecord {
        ClaimRecord {
            character_id: Uuid::nil(),
            minted,
            handoff: Some(HandoffClaimRecord {
                token: token.into(),
                dumped_under: dumped,
                adopted,
            }),
        }
    }

    #[test]
    fn a_handoff_adopted_after_a_login_claimed_in_between_is_a_violation() {
        let verdict =
            no_superseded_handoff_adopted(&[login(1), login(2), handoff("h", 1, 3, true)]);
        assert!(!verdict.holds);
        assert_eq!(verdict.violations, 1);
    }

    #[test]
    fn refusals_and_the_handoffs_own_retries_are_fine() {
        let verdict = no_superseded_handoff_adopted(&[
            login(1),
            login(2),
            handoff("z", 1, 3, false),
            handoff("h", 3, 4, true),
            handoff("h", 3, 5, true),
        ]);
        assert!(verdict.holds, "{verdict:?}");
        assert_eq!(verdict.checked, 2);
    }
}
