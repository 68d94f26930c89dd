//! Session order per character: every session the run started and every cleanup it appended
//! is recorded with its place in its character's order (the epoch of the copy, when it
//! happened, its id). During the run a scanner watches each character's session order mark
//! (Redis) and the order of the last cleanup location in its row (Postgres): neither may ever go
//! backwards (an older event's effect landing after a newer one's). Once the journal is
//! drained, each mark must name one of its character's recorded events, no older than its
//! newest cleanup (a session start whose write failed may be newer than the mark).

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::report::Invariant;
use shardkeep::PostgresBackend;
use shardkeep::coord::{Coordination, SessionOrder};

/// One session event: a session started, or a cleanup appended to the journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SessionEvent {
    pub(super) character_id: Uuid,
    pub(super) order: SessionOrder,
    /// True for a cleanup (its effects must apply unless a newer event came first).
    pub(super) cleanup: bool,
}

type Place = (i64, i64, String);

fn place(order: &SessionOrder) -> Place {
    (
        order.owner_epoch,
        order.at.timestamp_micros(),
        order.event_id.to_string(),
    )
}

/// Per character: the newest cleanup, and every recorded event's place.
fn expectations(events: &[SessionEvent]) -> HashMap<Uuid, (Option<Place>, Vec<Place>)> {
    let mut out: HashMap<Uuid, (Option<Place>, Vec<Place>)> = HashMap::new();
    for event in events {
        let p = place(&event.order);
        let entry = out.entry(event.character_id).or_default();
        if event.cleanup && entry.0.as_ref().is_none_or(|newest| p > *newest) {
            entry.0 = Some(p.clone());
        }
        entry.1.push(p);
    }
    out
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
    pg: &PostgresBackend,
    coord: &Coordination,
    conn: &shardkeep::backend::redis::RedisConn,
    observed: &std::sync::Mutex<OrderObserved>,
) {
    let rows: Result<Vec<LocationOrderRow>, _> =
        sqlx::query_as("SELECT id, journal_location_epoch, journal_location_at FROM characters")
            .fetch_all(pg.exec())
            .await;
    let Ok(rows) = rows else {
        return;
    };
    let ids: Vec<Uuid> = rows.iter().map(|(id, _, _)| *id).collect();
    let Ok(marks) = read_marks(coord, conn, &ids).await else {
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
async fn read_marks(
    coord: &Coordination,
    conn: &shardkeep::backend::redis::RedisConn,
    ids: &[Uuid],
) -> Result<Vec<Option<Place>>, String> {
    let mut conn = conn.clone();
    let mut out = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(256) {
        let mut pipe = redis::pipe();
        for id in chunk {
            let key = coord
                .keys()
                .presence_session_order(&id.to_string())
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

/// No step backwards was seen, and each character's mark names one of its recorded events, no
/// older than its newest cleanup.
pub(super) async fn journal_order_kept(
    coord: &Coordination,
    conn: &shardkeep::backend::redis::RedisConn,
    events: &[SessionEvent],
    observed: &OrderObserved,
) -> Invariant {
    let expected = expectations(events);
    let mut details = observed.backwards.clone();
    let ids: Vec<Uuid> = expected.keys().copied().collect();
    match read_marks(coord, conn, &ids).await {
        Err(err) => details.push(format!("order marks unreadable: {err}")),
        Ok(marks) => {
            for (id, mark) in ids.iter().zip(marks) {
                let (newest_cleanup, known) = &expected[id];
                let Some(newest_cleanup) = newest_cleanup else {
                    continue;
                };
                let fine = mark
                    .as_ref()
                    .is_some_and(|m| m >= newest_cleanup && known.contains(m));
                if !fine {
                    details.push(format!(
                        "{id}: newest cleanup appended is {newest_cleanup:?}, the order mark says {mark:?}"
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
    fn the_newest_cleanup_is_by_epoch_then_time_then_id() {
        let id = Uuid::nil();
        let at = |s: i64| DateTime::from_timestamp(s, 0).unwrap_or_default();
        let event = |epoch, secs, n: u128, cleanup| SessionEvent {
            character_id: id,
            order: SessionOrder {
                owner_epoch: epoch,
                at: at(secs),
                event_id: Uuid::from_u128(n),
            },
            cleanup,
        };
        let events = [
            event(2, 50, 1, true),
            event(3, 10, 2, true),
            event(3, 10, 3, true),
            event(1, 99, 4, true),
            event(3, 20, 5, false),
        ];
        let (newest, known) = &expectations(&events)[&id];
        assert_eq!(newest.as_ref(), Some(&place(&events[2].order)));
        assert_eq!(known.len(), 5);
    }
}
