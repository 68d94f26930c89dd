//! The simulator's reward ledger: every reward a copy issued (by epoch and issue sequence) and
//! what each copy started out with. A content — a loaded copy, or a row at the end — must hold
//! exactly the rewards its issue marks say it holds: the base its origin copy loaded, that
//! copy's rewards up to its mark, and those it holds past the mark. A reward applied twice (a
//! job granting what a dump already held, a replay of what a checkpoint held) breaks the sum.

use std::collections::{BTreeMap, HashMap};

use uuid::Uuid;

use shardkeep::character::ContentOrigin;

/// Experience and currency.
type Amounts = (i64, i64);

/// What the simulator knows of every copy's rewards.
#[derive(Debug, Default)]
pub(super) struct RewardLedger {
    /// What each copy (character, epoch) started out holding.
    loaded: HashMap<(Uuid, i64), Amounts>,
    /// Each copy's rewards by issue sequence.
    issued: HashMap<(Uuid, i64), BTreeMap<u64, Amounts>>,
    /// Contents whose amounts were checked.
    pub(super) checked: u64,
    /// Contents whose origin copy's start is unknown (not checked).
    pub(super) unknown: u64,
    /// Contents whose amounts are not what their marks say.
    pub(super) problems: Vec<String>,
}

impl RewardLedger {
    /// About how many bytes the ledger holds (entries times their size, maps' spare capacity
    /// included; allocator overhead left out).
    pub(super) fn approx_bytes(&self) -> u64 {
        use std::mem::size_of;
        let key = size_of::<(Uuid, i64)>();
        let loaded = self.loaded.capacity() * (key + size_of::<Amounts>() + 1);
        let issued = self.issued.capacity() * (key + size_of::<BTreeMap<u64, Amounts>>() + 1)
            + self
                .issued
                .values()
                .map(|m| m.len() * (size_of::<u64>() + size_of::<Amounts>() + 8))
                .sum::<usize>();
        let problems = self.problems.iter().map(String::len).sum::<usize>();
        (loaded + issued + problems) as u64
    }

    /// The copy at `epoch` issued reward `seq`.
    pub(super) fn issued(&mut self, character: Uuid, epoch: i64, seq: u64, amounts: Amounts) {
        self.issued
            .entry((character, epoch))
            .or_default()
            .insert(seq, amounts);
    }

    /// What a content from `origin` must hold; `None` when the origin copy's start is unknown.
    pub(super) fn expected(&self, character: Uuid, origin: &ContentOrigin) -> Option<Amounts> {
        let base = if origin.epoch == 0 {
            (0, 0)
        } else {
            *self.loaded.get(&(character, origin.epoch))?
        };
        let mut total = base;
        let mut add = |amounts: &Amounts| {
            total.0 += amounts.0;
            total.1 += amounts.1;
        };
        if let Some(issued) = self.issued.get(&(character, origin.epoch)) {
            issued.range(..=origin.mark).for_each(|(_, a)| add(a));
        }
        for (epoch, seq) in &origin.beyond_mark {
            if let Some(amounts) = self
                .issued
                .get(&(character, *epoch))
                .and_then(|issued| issued.get(seq))
            {
                add(amounts);
            }
        }
        Some(total)
    }

    /// Checks a content against its origin; `what` names it in a problem.
    pub(super) fn check(
        &mut self,
        character: Uuid,
        origin: &ContentOrigin,
        holds: Amounts,
        what: &str,
    ) {
        match self.expected(character, origin) {
            None => self.unknown += 1,
            Some(expected) => {
                self.checked += 1;
                if expected != holds {
                    self.problems.push(format!(
                        "{character}: {what} holds experience/currency {holds:?} but its origin \
                         (epoch {}, mark {}, past it {:?}) adds up to {expected:?}",
                        origin.epoch, origin.mark, origin.beyond_mark
                    ));
                }
            }
        }
    }

    /// A copy at `epoch` started out holding `holds`, from `origin`.
    pub(super) fn loaded_from(
        &mut self,
        character: Uuid,
        epoch: i64,
        origin: &ContentOrigin,
        holds: Amounts,
        what: &str,
    ) {
        self.check(character, origin, holds, what);
        self.loaded.insert((character, epoch), holds);
    }
}

/// Experience and currency of a stored state document.
pub(super) fn amounts_of(state: &serde_json::Value) -> Amounts {
    let number = |field: &str| {
        state
            .get(field)
            .and_then(serde_json::Value::as_i64)
            .unwrap_or(0)
    };
    (number("experience"), number("currency"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(epoch: i64, mark: u64, beyond_mark: Vec<(i64, u64)>) -> ContentOrigin {
        ContentOrigin {
            epoch,
            mark,
            beyond_mark,
        }
    }

    #[test]
    fn a_content_holds_its_base_its_rewards_to_the_mark_and_those_past_it() {
        let c = Uuid::from_u128(1);
        let mut ledger = RewardLedger::default();
        ledger.loaded_from(c, 1, &origin(0, 0, vec![]), (0, 0), "copy 1");
        for seq in 1..=4 {
            ledger.issued(c, 1, seq, (10 * seq as i64, 1));
        }
        // Rewards 1 and 2 dumped; 4 applied by its job; 3 lost with a crash.
        ledger.loaded_from(c, 2, &origin(1, 2, vec![(1, 4)]), (70, 3), "copy 2");
        assert!(ledger.problems.is_empty(), "{:?}", ledger.problems);
        assert_eq!(ledger.expected(c, &origin(2, 0, vec![])), Some((70, 3)));
        // Reward 2 granted twice (a replay of what the content held) is caught.
        ledger.check(c, &origin(1, 2, vec![]), (50, 3), "a row");
        assert_eq!(ledger.problems.len(), 1, "{:?}", ledger.problems);
        // A copy the simulator never saw load is not checked.
        ledger.check(c, &origin(9, 1, vec![]), (0, 0), "a row");
        assert_eq!((ledger.checked, ledger.unknown), (3, 1));
    }
}
