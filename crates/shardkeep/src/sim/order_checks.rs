//! Journal order per character: every cleanup the run appended is recorded with its place in
//! its character's order (the epoch of the copy whose stream closed, when it closed, the entry
//! id). During the run a scanner watches each character's cleanup order mark (Redis) and the
//! order of the last cleanup location in its row (Postgres): neither may ever go backwards (an
//! older cleanup's effect landing after a newer one's). Once the journal is drained, each mark
//! must name its character's newest appended cleanup.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::report::Invariant;
use crate::coord::Coordination;

/// One appended cleanup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct CleanupRecord {
    pub(super) character_id: Uuid,
    pub(super) owner_epoch: i64,
    pub(super) closed_at: DateTime<Utc>,
    pub(super) entry_id: Uuid,
}

type Place = (i64, i64, String);

fn place(record: &CleanupRecord) -> Place {
    (
        record.owner_epoch,
        record.closed_at.timestamp_micros(),
        record.entry_id.to_string(),
    )
}

/// The newest appended cleanup of each character.
fn newest(records: &[CleanupRecord]) -> HashMap<Uuid, Place> {
    let mut newest: HashMap<Uuid, Place> = HashMap::new();
    for record in records {
        let p = place(record);
        newest
            .entry(record.character_id)
            .and_modify(|n| {
                if p > *n {
                    *n = p.clone();
                }
            })
            .or_insert(p);
    }
    newest
}

/// What the order scans have seen: the highest mark and row location order per character,
/// and every step backwards.
#[derive(Debug, Default)]
pub(super) struct OrderObserved {
    marks: HashMap<Uuid, Place>,
    rows: HashMap<Uuid, (i64, i64)>,
    backwards: Vec<String>,
    scans: u64,
}

impl OrderObserved {
    fn see_mark(&mut self, id: Uuid, mark: Place) {
        match self.marks.get(&id) {
            Some(high) if mark < *high => self.backwards.push(format!(
                "{id}: cleanup order mark went back from {high:?} to {mark:?}"
            )),
            _ => {
                self.marks.insert(id, mark);
            }
        }
    }

    fn see_row(&mut self, id: Uuid, order: (i64, i64)) {
        match self.rows.get(&id) {
            Some(high) if order < *high => self.backwards.push(format!(
                "{id}: the row's cleanup location went back from {high:?} to {order:?}"
            )),
            _ => {
                self.rows.insert(id, order);
            }
        }
    }
}

/// One scan: every row's cleanup location order, and every character's mark.
pub(super) async fn scan(
    pg: &crate::backend::PostgresBackend,
    coord: &Coordination,
    observed: &std::sync::Mutex<OrderObserved>,
) {
    let rows: Result<Vec<LocationOrderRow>, _> =
        sqlx::query_as("SELECT id, journal_location_epoch, journal_location_at FROM characters")
            .fetch_all(pg.pool())
            .await;
    let Ok(rows) = rows else {
        return;
    };
    let ids: Vec<Uuid> = rows.iter().map(|(id, _, _)| *id).collect();
    let Ok(marks) = read_marks(coord, &ids).await else {
        return;
    };
    let Ok(mut observed) = observed.lock() else {
        return;
    };
    observed.scans += 1;
    for (id, epoch, at) in rows {
        if let (Some(epoch), Some(at)) = (epoch, at) {
            observed.see_row(id, (epoch, at.timestamp_micros()));
        }
    }
    for (id, mark) in ids.into_iter().zip(marks) {
        if let Some(mark) = mark {
            observed.see_mark(id, mark);
        }
    }
}

type RawMark = (Option<i64>, Option<i64>, Option<String>);

/// A row's id and the order of its last cleanup location.
type LocationOrderRow = (Uuid, Option<i64>, Option<DateTime<Utc>>);

/// The cleanup order mark of each of `ids`, in order (`None`: no mark).
async fn read_marks(coord: &Coordination, ids: &[Uuid]) -> Result<Vec<Option<Place>>, String> {
    let mut conn = coord.conn();
    let mut out = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(256) {
        let mut pipe = redis::pipe();
        for id in chunk {
            let key = coord
                .keys()
                .presence_cleanup_order(&id.to_string())
                .map_err(|e| e.to_string())?;
            pipe.cmd("HMGET")
                .arg(key)
                .arg("epoch")
                .arg("at")
                .arg("entry");
        }
        let marks: Vec<RawMark> = pipe
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        out.extend(marks.into_iter().map(|m| match m {
            (Some(epoch), Some(at), Some(entry)) => Some((epoch, at, entry)),
            _ => None,
        }));
    }
    Ok(out)
}

/// No step backwards was seen, and each character's mark names its newest appended cleanup.
pub(super) async fn journal_order_kept(
    coord: &Coordination,
    records: &[CleanupRecord],
    observed: &OrderObserved,
) -> Invariant {
    let expected = newest(records);
    let mut details = observed.backwards.clone();
    let ids: Vec<Uuid> = expected.keys().copied().collect();
    match read_marks(coord, &ids).await {
        Err(err) => details.push(format!("order marks unreadable: {err}")),
        Ok(marks) => {
            for (id, mark) in ids.iter().zip(marks) {
                let want = &expected[id];
                if mark.as_ref() != Some(want) {
                    details.push(format!(
                        "{id}: newest cleanup appended is {want:?}, the order mark says {mark:?}"
                    ));
                }
            }
        }
    }
    Invariant::new(
        "journal entries applied in order",
        expected.len() as u64 + observed.scans,
        details,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_or_row_order_going_back_is_recorded() {
        let id = Uuid::nil();
        let mut observed = OrderObserved::default();
        observed.see_mark(id, (3, 10, "b".into()));
        observed.see_mark(id, (3, 12, "a".into()));
        observed.see_mark(id, (3, 11, "z".into()));
        observed.see_row(id, (2, 5));
        observed.see_row(id, (2, 5));
        observed.see_row(id, (1, 9));
        assert_eq!(observed.backwards.len(), 2, "{:?}", observed.backwards);
    }

    #[test]
    fn the_newest_cleanup_is_by_epoch_then_close_time_then_entry() {
        let id = Uuid::nil();
        let at = |s: i64| DateTime::from_timestamp(s, 0).unwrap_or_default();
        let record = |epoch, secs, entry: u128| CleanupRecord {
            character_id: id,
            owner_epoch: epoch,
            closed_at: at(secs),
            entry_id: Uuid::from_u128(entry),
        };
        let records = [
            record(2, 50, 1),
            record(3, 10, 2),
            record(3, 10, 3),
            record(1, 99, 4),
        ];
        assert_eq!(newest(&records)[&id], place(&records[2]));
    }
}
