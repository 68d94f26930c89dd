//! The checker: it scans the character rows during the run (over a direct, never-faulted
//! connection) and, at the end, checks the invariants against the durable stores.
//!
//! What a scan records: each character's highest version and experience seen (a later row with
//! less is a rollback), and each item's holder (a holder change must be explained by an
//! `item_transferred` audit row naming the new holder and the item).

use std::collections::{HashMap, HashSet};

use serde_json::Value;
use uuid::Uuid;

use super::report::Invariant;
use super::rewards::RewardLedger;
use shardkeep::PostgresBackend;
use shardkeep::character::ContentOrigin;
use shardkeep::coord::Coordination;
use shardkeep::queue::QueueDepths;

/// One character row as the checker reads it.
#[derive(Debug, Clone)]
pub(super) struct RowView {
    pub(super) id: Uuid,
    pub(super) version: i64,
    pub(super) experience: i64,
    pub(super) currency: i64,
    pub(super) items: Vec<Uuid>,
    /// Whose content the row holds, and which of that copy's issued writes it holds.
    pub(super) origin: ContentOrigin,
}

use shardkeep_reference::game::state::stored_item_ids;

pub(super) type RowTuple = (Uuid, i64, Value, i64, i64, Vec<i64>, Vec<i64>);

pub(super) fn view((id, version, state, epoch, mark, beyond_epochs, beyond): RowTuple) -> RowView {
    let (experience, currency) = super::rewards::amounts_of(&state);
    let seq = |n: i64| u64::try_from(n).unwrap_or(0);
    RowView {
        id,
        version,
        experience,
        currency,
        items: stored_item_ids(&state),
        origin: ContentOrigin {
            epoch,
            mark: seq(mark),
            beyond_mark: beyond_epochs
                .into_iter()
                .zip(beyond.into_iter().map(seq))
                .collect(),
        },
    }
}

/// Reads every character row, with the issue mark of its content and the sequenced job effects
/// applied to it since (the bookkeeping beside the row).
pub(super) async fn read_rows(pg: &PostgresBackend) -> Result<Vec<RowView>, sqlx::Error> {
    let rows: Vec<RowTuple> = sqlx::query_as(
        "SELECT c.id, c.state_version, c.state, c.live_issue_epoch, c.live_issue_mark,
                COALESCE(b.epochs, '{}'), COALESCE(b.seqs, '{}')
           FROM characters c
           LEFT JOIN LATERAL (
               SELECT array_agg(e.owner_epoch ORDER BY e.owner_epoch, e.issue_seq) AS epochs,
                      array_agg(e.issue_seq ORDER BY e.owner_epoch, e.issue_seq) AS seqs
                 FROM character_job_effects e
                WHERE e.character_id = c.id AND e.issue_seq > 0
                  AND (e.owner_epoch > c.live_issue_epoch
                       OR (e.owner_epoch = c.live_issue_epoch AND e.issue_seq > c.live_issue_mark))
           ) b ON true",
    )
    .fetch_all(pg.exec())
    .await?;
    Ok(rows.into_iter().map(view).collect())
}

/// What the scans have seen so far.
#[derive(Debug, Default)]
pub(super) struct Observed {
    /// Highest (version, experience) seen per character.
    high: HashMap<Uuid, (i64, i64)>,
    /// Last row seen holding each item.
    holder: HashMap<Uuid, Uuid>,
    /// Holder changes to explain: (item, new holder, old holder).
    moves: Vec<(Uuid, Uuid, Uuid)>,
    /// Rows seen going backwards.
    rollbacks: Vec<String>,
    /// Items seen in two places in one scan.
    duplicates: Vec<String>,
    /// Scans done.
    pub(super) scans: u64,
}

impl Observed {
    /// About how many bytes the scanner's record holds (it keeps every item it has seen and
    /// every move, to be explained at the end: part of the checker, not of the library).
    pub(super) fn approx_bytes(&self) -> u64 {
        use std::mem::size_of;
        let high = self.high.capacity() * (size_of::<(Uuid, (i64, i64))>() + 1);
        let holder = self.holder.capacity() * (size_of::<(Uuid, Uuid)>() + 1);
        let moves = self.moves.len() * size_of::<(Uuid, Uuid, Uuid)>();
        let text: usize = self
            .rollbacks
            .iter()
            .chain(&self.duplicates)
            .map(String::len)
            .sum();
        (high + holder + moves + text) as u64
    }

    /// Folds in one scan.
    pub(super) fn record(&mut self, rows: &[RowView]) {
        self.scans += 1;
        let mut seen_now: HashMap<Uuid, Uuid> = HashMap::new();
        for row in rows {
            let high = self
                .high
                .entry(row.id)
                .or_insert((row.version, row.experience));
            if row.version < high.0 || row.experience < high.1 {
                self.rollbacks.push(format!(
                    "{}: row went from version {} / experience {} back to version {} / experience {}",
                    row.id, high.0, high.1, row.version, row.experience
                ));
            }
            *high = (high.0.max(row.version), high.1.max(row.experience));
            for item in &row.items {
                if let Some(other) = seen_now.insert(*item, row.id) {
                    self.duplicates.push(format!(
                        "item {item} held by {other} and {} at once",
                        row.id
                    ));
                }
            }
        }
        for (item, holder) in seen_now {
            if let Some(previous) = self.holder.insert(item, holder)
                && previous != holder
            {
                self.moves.push((item, holder, previous));
            }
        }
    }

    /// Items any scan saw in a row.
    pub(super) fn items_seen(&self) -> impl Iterator<Item = &Uuid> {
        self.holder.keys()
    }
}

/// Everything the end checks read.
pub(super) struct EndState<'a> {
    pub(super) rows: &'a [RowView],
    pub(super) observed: &'a Observed,
    pub(super) acked: &'a HashMap<Uuid, i64>,
    /// Items on floors when the shards shut down, with who released each (and at which epoch).
    pub(super) end_floors: &'a [(Uuid, Option<(Uuid, i64)>)],
    pub(super) destroyed: &'a HashSet<Uuid>,
    /// (subject, item id) of every `item_transferred` audit row.
    pub(super) transfer_audit: &'a HashSet<(Uuid, Uuid)>,
    pub(super) placement_problems: &'a [String],
    pub(super) dangling: &'a Dangling,
    /// What each copy issued and started out with.
    pub(super) rewards: &'a RewardLedger,
    /// The item-load ledger: (item, character) → the highest epoch that loaded holding it.
    pub(super) item_loads: &'a HashMap<(Uuid, Uuid), i64>,
}

/// Leftovers after the drain.
#[derive(Debug, Default, Clone)]
pub(super) struct Dangling {
    pub(super) retry_leased: i64,
    pub(super) retry_pending: i64,
    pub(super) journal: QueueDepths,
    pub(super) untaken_handoffs: usize,
    /// Transfers still pending (never completed by their source).
    pub(super) pending_transfers: usize,
    /// Activation markers left although their transfer is no longer pending.
    pub(super) stale_markers: usize,
}

/// No row older than its last acknowledged durable save, and no row seen going backwards.
pub(super) fn no_rollback(end: &EndState<'_>) -> Invariant {
    let mut details = end.observed.rollbacks.clone();
    for row in end.rows {
        if let Some(acked) = end.acked.get(&row.id)
            && row.version < *acked
        {
            details.push(format!(
                "{}: row at version {} after a save acknowledged at {acked}",
                row.id, row.version
            ));
        }
        if let Some((version, experience)) = end.observed.high.get(&row.id)
            && (row.version < *version || row.experience < *experience)
        {
            details.push(format!(
                "{}: final row version {} / experience {} is behind a scan's {version} / {experience}",
                row.id, row.version, row.experience
            ));
        }
    }
    let checked = end.rows.len() as u64;
    Invariant::new("no rollback", checked, details)
}

/// Every content holds exactly the rewards its issue marks say: each copy as it was loaded
/// (checked at the claim), and each row at the end — its origin copy's start, that copy's
/// rewards up to the row's mark, and its jobs applied past it. A reward applied twice, or one the
/// bookkeeping claims but the content lacks, breaks the sum.
pub(super) fn no_reward_twice(end: &EndState<'_>) -> Invariant {
    let mut details = end.rewards.problems.clone();
    let mut checked = end.rewards.checked;
    for row in end.rows {
        if let Some(expected) = end.rewards.expected(row.id, &row.origin) {
            checked += 1;
            if expected != (row.experience, row.currency) {
                details.push(format!(
                    "{}: row holds experience/currency {:?} but its origin (epoch {}, mark {}, \
                     past it {:?}) adds up to {expected:?}",
                    row.id,
                    (row.experience, row.currency),
                    row.origin.epoch,
                    row.origin.mark,
                    row.origin.beyond_mark
                ));
            }
        }
    }
    Invariant::new("no reward granted twice", checked, details)
}

/// Every item ever durable, or on a floor at the end, is held exactly once or its destruction
/// is recorded; every change of holder has its audit row.
pub(super) fn item_conservation(end: &EndState<'_>) -> Invariant {
    let mut holders: HashMap<Uuid, Vec<String>> = HashMap::new();
    for row in end.rows {
        for item in &row.items {
            holders.entry(*item).or_default().push(row.id.to_string());
        }
    }
    let rows: HashMap<Uuid, &RowView> = end.rows.iter().map(|r| (r.id, r)).collect();
    for (item, released) in end.end_floors {
        // A release a crash rolled back: the library voids this copy on pickup, so it is no
        // holder (its destruction is on the record with the floors).
        let phantom = released.is_some_and(|(by, epoch)| {
            rows.contains_key(&by)
                && end
                    .item_loads
                    .get(&(*item, by))
                    .is_some_and(|loaded| *loaded > epoch)
        });
        if !phantom {
            holders.entry(*item).or_default().push("a floor".into());
        }
    }
    let mut universe: HashSet<Uuid> = end.observed.items_seen().copied().collect();
    universe.extend(holders.keys().copied());
    let mut details = end.observed.duplicates.clone();
    for item in &universe {
        let held = holders.get(item).map_or(&[][..], Vec::as_slice);
        match held.len() {
            1 => {}
            0 if end.destroyed.contains(item) => {}
            0 => details.push(format!(
                "item {item} (last seen in row {}) is held by nothing and its destruction is not recorded",
                end.observed.holder.get(item).map_or("-".to_owned(), Uuid::to_string)
            )),
            _ => details.push(format!(
                "item {item} is held {} times: {}",
                held.len(),
                held.join(", ")
            )),
        }
    }
    let mut unexplained = 0;
    for (item, to, from) in &end.observed.moves {
        if !end.transfer_audit.contains(&(*to, *item)) {
            unexplained += 1;
            details.push(format!(
                "item {item} moved from {from} to {to} without an audit row"
            ));
        }
    }
    let _ = unexplained;
    Invariant::new("item conservation", universe.len() as u64, details)
}

/// Every live session had a placement naming its copy before the drain.
pub(super) fn sessions_placed(end: &EndState<'_>, sessions_checked: u64) -> Invariant {
    Invariant::new(
        "no live session without a placement",
        sessions_checked,
        end.placement_problems.to_vec(),
    )
}

/// Nothing leased, pending or consumed is left once the drain is over.
pub(super) fn nothing_dangling(end: &EndState<'_>) -> Invariant {
    let d = end.dangling;
    let mut details = Vec::new();
    if d.retry_leased > 0 {
        details.push(format!("{} retry jobs still leased", d.retry_leased));
    }
    if d.retry_pending > 0 {
        details.push(format!(
            "{} retry jobs neither done nor dead-lettered",
            d.retry_pending
        ));
    }
    if d.journal.processing > 0 {
        details.push(format!(
            "{} journal entries still leased",
            d.journal.processing
        ));
    }
    if d.journal.pending > 0 {
        details.push(format!(
            "{} journal entries never processed",
            d.journal.pending
        ));
    }
    if d.untaken_handoffs > 0 {
        details.push(format!(
            "{} handoff payloads never taken",
            d.untaken_handoffs
        ));
    }
    if d.pending_transfers > 0 {
        details.push(format!(
            "{} transfers never completed by their source",
            d.pending_transfers
        ));
    }
    if d.stale_markers > 0 {
        details.push(format!(
            "{} transfer markers of transfers no longer pending",
            d.stale_markers
        ));
    }
    Invariant::new("no dangling leases or consumed markers", 7, details)
}

/// Handoff payload keys still present (consumed markers excluded).
pub(super) async fn untaken_handoffs(coord: &Coordination) -> Result<usize, shardkeep::CoordError> {
    let pattern = format!("{{{}:handoff:*", coord.keys().namespace());
    let keys = scan(coord, &pattern).await?;
    Ok(keys.iter().filter(|k| !k.ends_with(":consumed")).count())
}

/// Transfers still pending, and activation markers whose transfer no longer is. A transfer
/// whose source was killed while it waited (`orphaned`) is not counted: nobody but its source
/// completes it, so it stays pending until its lifetime ends.
pub(super) async fn transfer_leftovers(
    coord: &Coordination,
    orphaned: &HashSet<String>,
) -> Result<(usize, usize), shardkeep::CoordError> {
    let orphaned: HashSet<String> = orphaned
        .iter()
        .filter_map(|token| coord.keys().transfer_pending(token).ok())
        .collect();
    let pending = scan(coord, &coord.keys().transfer_pending_pattern())
        .await?
        .into_iter()
        .filter(|key| !orphaned.contains(key))
        .count();
    let markers = scan(coord, &coord.keys().transfer_activated_pattern()).await?;
    let mut stale = 0;
    for key in markers {
        let Some(token) = coord.keys().transfer_token_of(&key) else {
            continue;
        };
        if !coord.transfer_is_pending(&token).await? {
            stale += 1;
        }
    }
    Ok((pending, stale))
}

async fn scan(coord: &Coordination, pattern: &str) -> Result<Vec<String>, shardkeep::CoordError> {
    coord.keys_matching(pattern, usize::MAX).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: u128, version: i64, xp: i64, items: &[u128]) -> RowView {
        RowView {
            id: Uuid::from_u128(id),
            version,
            experience: xp,
            currency: 0,
            items: items.iter().map(|i| Uuid::from_u128(*i)).collect(),
            origin: ContentOrigin::default(),
        }
    }

    #[test]
    fn scans_catch_rollbacks_duplicates_and_moves() {
        let mut seen = Observed::default();
        seen.record(&[row(1, 5, 100, &[10]), row(2, 3, 0, &[])]);
        seen.record(&[
            row(1, 4, 100, &[]),
            row(2, 4, 0, &[10, 11]),
            row(3, 1, 0, &[11]),
        ]);
        assert_eq!(seen.rollbacks.len(), 1, "{:?}", seen.rollbacks);
        assert_eq!(seen.duplicates.len(), 1, "{:?}", seen.duplicates);
        assert_eq!(
            seen.moves,
            vec![(Uuid::from_u128(10), Uuid::from_u128(2), Uuid::from_u128(1))]
        );
    }

    static NO_REWARDS: std::sync::LazyLock<RewardLedger> =
        std::sync::LazyLock::new(RewardLedger::default);
    static NO_LOADS: std::sync::LazyLock<HashMap<(Uuid, Uuid), i64>> =
        std::sync::LazyLock::new(HashMap::new);

    fn end<'a>(
        rows: &'a [RowView],
        observed: &'a Observed,
        destroyed: &'a HashSet<Uuid>,
        audit: &'a HashSet<(Uuid, Uuid)>,
        dangling: &'a Dangling,
        acked: &'a HashMap<Uuid, i64>,
    ) -> EndState<'a> {
        EndState {
            rows,
            observed,
            acked,
            end_floors: &[],
            destroyed,
            transfer_audit: audit,
            placement_problems: &[],
            dangling,
            rewards: &NO_REWARDS,
            item_loads: &NO_LOADS,
        }
    }

    #[test]
    fn conservation_needs_one_holder_a_recorded_destruction_and_audited_moves() {
        let mut observed = Observed::default();
        observed.record(&[row(1, 1, 0, &[10, 11, 12]), row(2, 1, 0, &[])]);
        observed.record(&[row(1, 2, 0, &[11, 12]), row(2, 2, 0, &[10])]);
        let rows = [row(1, 3, 0, &[12]), row(2, 3, 0, &[10])];
        let mut destroyed = HashSet::new();
        let mut audit = HashSet::new();
        let dangling = Dangling::default();
        let acked = HashMap::new();
        let state = end(&rows, &observed, &destroyed, &audit, &dangling, &acked);
        let verdict = item_conservation(&state);
        assert!(!verdict.holds);
        assert_eq!(verdict.details.len(), 2, "{:?}", verdict.details);
        destroyed.insert(Uuid::from_u128(11));
        audit.insert((Uuid::from_u128(2), Uuid::from_u128(10)));
        let state = end(&rows, &observed, &destroyed, &audit, &dangling, &acked);
        assert!(item_conservation(&state).holds);
    }

    #[test]
    fn a_floor_copy_whose_release_a_crash_rolled_back_is_no_holder() {
        let item = Uuid::from_u128(10);
        let releaser = Uuid::from_u128(1);
        let restored = row(1, 3, 0, &[10]);
        let observed = Observed::default();
        let destroyed: HashSet<Uuid> = [item].into();
        let audit = HashSet::new();
        let dangling = Dangling::default();
        let acked = HashMap::new();
        // Released at epoch 4, and the row still holds it: two holders...
        let floors = [(item, Some((releaser, 4)))];
        let rows = [restored.clone()];
        let mut state = end(&rows, &observed, &destroyed, &audit, &dangling, &acked);
        state.end_floors = &floors;
        assert!(!item_conservation(&state).holds);
        // ...unless a copy loaded after the release (epoch 6) started out holding it.
        let loads: HashMap<(Uuid, Uuid), i64> = [((item, releaser), 6)].into();
        let rows = [restored];
        let mut state = end(&rows, &observed, &destroyed, &audit, &dangling, &acked);
        state.end_floors = &floors;
        state.item_loads = &loads;
        assert!(item_conservation(&state).holds);
        // A load at or before the release epoch does not make it a phantom.
        let loads: HashMap<(Uuid, Uuid), i64> = [((item, releaser), 4)].into();
        state.item_loads = &loads;
        assert!(!item_conservation(&state).holds);
    }

    #[test]
    fn rewards_must_add_up_and_rollbacks_against_acks_are_caught() {
        let mut rewards = RewardLedger::default();
        let mut good = row(1, 7, 30, &[]);
        good.currency = 3;
        good.origin = ContentOrigin {
            epoch: 1,
            mark: 2,
            beyond_mark: vec![],
        };
        let mut twice = good.clone();
        twice.id = Uuid::from_u128(2);
        twice.experience = 40;
        twice.currency = 4;
        for row in [&good, &twice] {
            rewards.loaded_from(row.id, 1, &ContentOrigin::default(), (0, 0), "copy 1");
            rewards.issued(row.id, 1, 1, (10, 1));
            rewards.issued(row.id, 1, 2, (20, 2));
        }
        let rows = [good, twice];
        let observed = Observed::default();
        let destroyed = HashSet::new();
        let audit = HashSet::new();
        let dangling = Dangling::default();
        let mut acked = HashMap::new();
        acked.insert(Uuid::from_u128(1), 8);
        let mut state = end(&rows, &observed, &destroyed, &audit, &dangling, &acked);
        state.rewards = &rewards;
        let verdict = no_reward_twice(&state);
        assert_eq!(verdict.details.len(), 1, "{:?}", verdict.details);
        assert_eq!(verdict.checked, 4, "two loads and two rows");
        let rollback = no_rollback(&state);
        assert_eq!(rollback.details.len(), 1, "{:?}", rollback.details);
        assert!(nothing_dangling(&state).holds);
        let leased = Dangling {
            retry_leased: 1,
            ..Dangling::default()
        };
        let state = end(&rows, &observed, &destroyed, &audit, &leased, &acked);
        assert!(!nothing_dangling(&state).holds);
    }
}
