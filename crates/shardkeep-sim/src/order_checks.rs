//! Session order per character: every session the run started and every cleanup it appended
//! is recorded with its place in its character's order (the epoch of the copy, when it
//! happened, its id). During the run a scanner watches each character's session order mark
//! (Redis) and the order of the last cleanup location in its row (Postgres): neither may ever go
//! backwards (an older event's effect landing after a newer one's). Once the journal is
//! drained, each mark must name one of its character's recorded events, no older than its
//! newest cleanup (a session start whose write failed may be newer than the mark).

use std::collections::HashMap;

use uuid::Uuid;

use super::report::Invariant;
use shardkeep::RedisBackend;
use shardkeep::coord::{Coordination, SessionOrder};

use super::env::SimEnv;
use super::probe::Probe;

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
    env: &SimEnv,
    probe: &Probe,
    coord: &Coordination,
    observed: &std::sync::Mutex<OrderObserved>,
) {
    let Ok(rows) = probe.location_orders().await else {
        return;
    };
    let ids: Vec<Uuid> = rows.iter().map(|(id, _, _)| *id).collect();
    if let Ok(mut observed) = observed.lock() {
        observed.scans += 1;
        for (id, epoch, at) in rows {
            if let (Some(epoch), Some(at)) = (epoch, at) {
                observed.see_row(id, (epoch, at));
            }
        }
    }
    // Only marks a replica holds count: a mark still unreplicated when its master failed over
    // is lost with it, and the claim that wrote it failed (its cleanup applied nothing). The
    // embedded store's file has no replicas: what it holds is read as it is.
    let marks = match env.servers() {
        Some(s) => read_confirmed_marks(coord, &s.redis_direct, &ids).await,
        None => read_marks_through(coord, &ids).await,
    };
    let Ok(marks) = marks else {
        return;
    };
    let Ok(mut observed) = observed.lock() else {
        return;
    };
    for (id, mark) in ids.into_iter().zip(marks) {
        if let Some(mark) = mark {
            observed.see_mark(id, mark);
        }
    }
}

type RawMark = (Option<i64>, Option<i64>, Option<String>);

fn raw_to_place(m: RawMark) -> Option<Place> {
    match m {
        (Some(epoch), Some(at), Some(entry)) => Some((epoch, at, entry)),
        _ => None,
    }
}

/// Reads a mark and writes its epoch field back unchanged (no TTL or value changes), so that a
/// confirmed call proves a replica holds everything written to the key before the read.
const READ_MARK_CONFIRMED: &str = r"
local mark = redis.call('HMGET', KEYS[1], 'epoch', 'at', 'entry')
if mark[1] then redis.call('HSET', KEYS[1], 'epoch', mark[1]) end
return mark
";

/// The cleanup order mark of each of `ids` as a replica holds it (on a cluster, the read is
/// confirmed like the claims that write the marks; a chunk no replica acknowledged fails the
/// whole read). On a standalone server it is a plain read.
async fn read_confirmed_marks(
    coord: &Coordination,
    redis: &RedisBackend,
    ids: &[Uuid],
) -> Result<Vec<Option<Place>>, String> {
    let mut out = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(256) {
        let mut pipe = redis::pipe();
        for id in chunk {
            let key = coord
                .keys()
                .presence_session_order(&id.to_string())
                .map_err(|e| e.to_string())?;
            pipe.cmd("EVAL").arg(READ_MARK_CONFIRMED).arg(1).arg(key);
        }
        let marks: Vec<RawMark> = redis
            .query_confirmed(pipe)
            .await
            .map_err(|e| e.to_string())?;
        out.extend(marks.into_iter().map(raw_to_place));
    }
    Ok(out)
}

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
        out.extend(marks.into_iter().map(raw_to_place));
    }
    Ok(out)
}

/// The cleanup order mark of each of `ids`, read through the coordination handle one by one
/// (the embedded store's file, where a read is a local query).
async fn read_marks_through(
    coord: &Coordination,
    ids: &[Uuid],
) -> Result<Vec<Option<Place>>, String> {
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let mark = coord
            .session_order_mark(&id.to_string())
            .await
            .map_err(|e| e.to_string())?;
        out.push(mark);
    }
    Ok(out)
}

/// No step backwards was seen, and each character's mark names one of its recorded events, no
/// older than its newest cleanup.
pub(super) async fn journal_order_kept(
    env: &SimEnv,
    coord: &Coordination,
    events: &[SessionEvent],
    observed: &OrderObserved,
) -> Invariant {
    let expected = expectations(events);
    let mut details = observed.backwards.clone();
    let ids: Vec<Uuid> = expected.keys().copied().collect();
    let marks = match env.servers() {
        Some(s) => read_marks(coord, &s.redis_conn, &ids).await,
        None => read_marks_through(coord, &ids).await,
    };
    match marks {
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
                    // The character's last events, for whoever reads the failure.
                    let mut last: Vec<(&SessionOrder, bool)> = events
                        .iter()
                        .filter(|e| e.character_id == *id)
                        .map(|e| (&e.order, e.cleanup))
                        .collect();
                    last.sort_by_key(|(order, _)| place(order));
                    let last: Vec<String> = last
                        .iter()
                        .rev()
                        .take(4)
                        .map(|(o, cleanup)| {
                            let what = if *cleanup { "cleanup" } else { "start" };
                            format!("{what} {:?}", place(o))
                        })
                        .collect();
                    details.push(format!(
                        "{id}: newest cleanup appended is {newest_cleanup:?}, the order mark says \
                         {mark:?} (last events, newest first: {})",
                        last.join("; ")
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
    use chrono::{DateTime, Utc};

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

    /// The failover runs' false "went back": a claim's mark on its master that no replica held
    /// yet (the claim failed) was recorded by the scan, then lost in the promotion. A confirmed
    /// read does not report a mark until a replica holds it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_mark_no_replica_holds_is_not_read_as_seen() {
        use shardkeep::backend::redis::RedisTimeouts;
        use shardkeep::coord::CoordinationConfig;
        use shardkeep::{Keyspace, RedisBackend};
        use shardkeep_testkit::cluster::PrivateCluster;
        use std::time::Duration;

        let cluster = PrivateCluster::start().await;
        let timeouts = RedisTimeouts {
            connect: Duration::from_millis(500),
            response: Duration::from_millis(1000),
        };
        let keys = Keyspace::new("order-confirm").unwrap();
        let redis = RedisBackend::connect("REDIS_URL", &cluster.url, keys, timeouts)
            .await
            .unwrap();
        let coord = Coordination::new(redis.clone(), CoordinationConfig::default());
        let id = Uuid::new_v4();
        let order = |epoch| SessionOrder {
            owner_epoch: epoch,
            at: Utc::now(),
            event_id: Uuid::new_v4(),
        };
        let first = order(1);
        // A replica just joined may not acknowledge at once: the claim is repeated until it does.
        let mut claimed = Err(None);
        for _ in 0..100 {
            match coord.session_order_claim(&id.to_string(), &first).await {
                Ok(check) => {
                    claimed = Ok(check);
                    break;
                }
                Err(err) => claimed = Err(Some(err)),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(claimed.is_ok(), "the first mark never counted: {claimed:?}");
        let seen = read_confirmed_marks(&coord, &redis, &[id]).await.unwrap();
        assert_eq!(seen, vec![Some(place(&first))]);

        cluster.freeze_replicas(Duration::from_millis(2500));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let second = order(2);
        let claimed = coord.session_order_claim(&id.to_string(), &second).await;
        assert!(claimed.is_err(), "no replica can acknowledge: {claimed:?}");
        let on_master = read_marks(&coord, &redis.conn(), &[id]).await.unwrap();
        assert_eq!(on_master, vec![Some(place(&second))], "the master holds it");
        let confirmed = read_confirmed_marks(&coord, &redis, &[id]).await;
        assert!(
            confirmed.is_err(),
            "a mark no replica holds was read as seen: {confirmed:?}"
        );

        // Once the replica has it, the same read reports it.
        let mut seen = None;
        for _ in 0..100 {
            if let Ok(marks) = read_confirmed_marks(&coord, &redis, &[id]).await {
                seen = Some(marks);
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(seen, Some(vec![Some(place(&second))]));
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
