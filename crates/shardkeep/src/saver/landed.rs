//! When each character's state last became durable on each tier — the crash window. A kill -9
//! loses what changed since the snapshot of a character's last landed checkpoint (Redis) or row
//! write (Postgres); the shard exports the worst and p99 of those ages over its residents.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::telemetry;

/// A durability tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// The Redis checkpoint.
    Checkpoint,
    /// The Postgres row.
    Row,
}

/// When a character's snapshots last landed, by the time each was dumped, and the row version
/// the last landed row write made, with the epoch of the copy that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Landed {
    checkpoint: Instant,
    row: Instant,
    row_version: Option<(i64, i64)>,
}

/// The worst and p99 age over the residents, per tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UnsavedAges {
    /// Residents measured.
    pub residents: usize,
    /// Oldest checkpoint.
    pub checkpoint_worst: Duration,
    /// 99th percentile checkpoint age.
    pub checkpoint_p99: Duration,
    /// Oldest row write.
    pub row_worst: Duration,
    /// 99th percentile row age.
    pub row_p99: Duration,
}

/// Per-character landing times, written by the saver, read by the shard. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct LandedWrites {
    by_character: Arc<Mutex<HashMap<Uuid, Landed>>>,
}

/// Worst and p99 (nearest rank) of `ages`, which it reorders (linear time: no full sort, since
/// a shard measures every resident once per checkpoint period inside a pulse).
fn worst_and_p99(ages: &mut [Duration]) -> (Duration, Duration) {
    let Some(worst) = ages.iter().max().copied() else {
        return (Duration::ZERO, Duration::ZERO);
    };
    let rank = (ages.len() * 99).div_ceil(100).max(1) - 1;
    let (_, p99, _) = ages.select_nth_unstable(rank);
    (worst, *p99)
}

impl LandedWrites {
    /// Records that snapshots dumped at the given instants landed on `tier`.
    pub(crate) fn record(&self, tier: Tier, landed: impl IntoIterator<Item = (Uuid, Instant)>) {
        let Ok(mut map) = self.by_character.lock() else {
            return;
        };
        for (id, dumped_at) in landed {
            let entry = map.entry(id).or_insert(Landed {
                checkpoint: dumped_at,
                row: dumped_at,
                row_version: None,
            });
            let slot = match tier {
                Tier::Checkpoint => &mut entry.checkpoint,
                Tier::Row => &mut entry.row,
            };
            *slot = (*slot).max(dumped_at);
        }
    }

    /// Records that a row write of `request`'s copy landed, making row version `version`.
    pub(crate) fn row_landed(&self, request: &super::SaveRequest, version: i64) {
        let Ok(mut map) = self.by_character.lock() else {
            return;
        };
        let snapshot = &request.snapshot;
        let at = request.dumped_at;
        let entry = map.entry(snapshot.character_id).or_insert(Landed {
            checkpoint: at,
            row: at,
            row_version: None,
        });
        if at >= entry.row || entry.row_version.is_none() {
            entry.row = entry.row.max(at);
            entry.row_version = Some((snapshot.owner_epoch, version));
        }
    }

    /// The checkpoints among `requests` raised to the row version of a landed row write of the
    /// same copy dumped before them, when that is newer than the version each was dumped at,
    /// by their index in `requests` (the rest stand as dumped), all under one hold of the map's
    /// lock. A copy learns a version only once it hears its write landed; a checkpoint it dumped
    /// after a flush's dump but before that carries newer content than the row at an older
    /// version, and would rank below the row at the next login (freshness compares versions
    /// within an owner): a crash would then lose what it held beyond the flush. It holds
    /// everything that write put in the row, so it goes at the write's version.
    pub(crate) fn raised_many(
        &self,
        requests: &[super::SaveRequest],
    ) -> Vec<(usize, crate::character::CharacterSnapshot)> {
        let Ok(map) = self.by_character.lock() else {
            return Vec::new();
        };
        requests
            .iter()
            .enumerate()
            .filter_map(|(i, request)| Some((i, Self::raised_in(&map, request)?)))
            .collect()
    }

    /// One request of [`LandedWrites::raised_many`].
    fn raised_in(
        map: &HashMap<Uuid, Landed>,
        request: &super::SaveRequest,
    ) -> Option<crate::character::CharacterSnapshot> {
        let snapshot = &request.snapshot;
        let landed = map.get(&snapshot.character_id)?;
        let (epoch, version) = landed.row_version?;
        (epoch == snapshot.owner_epoch
            && landed.row <= request.dumped_at
            && version > snapshot.state_version)
            .then(|| crate::character::CharacterSnapshot {
                state_version: version,
                ..snapshot.clone()
            })
    }

    /// Records that `id`'s state is durable as of `at`, as it is when just loaded: its ages
    /// start over, whatever an earlier stay in this process left (a player who logged out and
    /// back in before the map was pruned would otherwise count from its old stay's writes).
    pub fn loaded(&self, id: Uuid, at: Instant) {
        if let Ok(mut map) = self.by_character.lock() {
            map.insert(
                id,
                Landed {
                    checkpoint: at,
                    row: at,
                    row_version: None,
                },
            );
        }
    }

    /// Ages at `now` over `residents`. A resident with no landed write yet counts from the first
    /// time it was seen here (a landing or a measure): its state was durable when it was loaded,
    /// so right after a login this understates its age by up to one measuring period.
    /// Characters no longer resident are forgotten once they make up a fifth of what is kept
    /// (the map is not rebuilt on every measure).
    pub fn measure(&self, now: Instant, residents: &[Uuid]) -> UnsavedAges {
        let Ok(mut map) = self.by_character.lock() else {
            return UnsavedAges::default();
        };
        let mut checkpoints = Vec::with_capacity(residents.len());
        let mut rows = Vec::with_capacity(residents.len());
        for id in residents {
            let landed = *map.entry(*id).or_insert(Landed {
                checkpoint: now,
                row: now,
                row_version: None,
            });
            checkpoints.push(now.saturating_duration_since(landed.checkpoint));
            rows.push(now.saturating_duration_since(landed.row));
        }
        if map.len() > residents.len() + residents.len() / 4 {
            let kept: std::collections::HashSet<&Uuid> = residents.iter().collect();
            map.retain(|id, _| kept.contains(id));
        }
        drop(map);
        let (checkpoint_worst, checkpoint_p99) = worst_and_p99(&mut checkpoints);
        let (row_worst, row_p99) = worst_and_p99(&mut rows);
        UnsavedAges {
            residents: residents.len(),
            checkpoint_worst,
            checkpoint_p99,
            row_worst,
            row_p99,
        }
    }

    /// Measures and exports `shardkeep_unsaved_change_age_seconds` for `shard`.
    pub fn export(&self, shard: &str, residents: &[Uuid]) -> UnsavedAges {
        let ages = self.measure(Instant::now(), residents);
        for (tier, stat, age) in [
            ("checkpoint", "worst", ages.checkpoint_worst),
            ("checkpoint", "p99", ages.checkpoint_p99),
            ("row", "worst", ages.row_worst),
            ("row", "p99", ages.row_p99),
        ] {
            metrics::gauge!(telemetry::UNSAVED_CHANGE_AGE_SECONDS,
                "shard" => shard.to_owned(), "tier" => tier, "stat" => stat)
            .set(age.as_secs_f64());
        }
        ages
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_run_from_the_last_landed_snapshot_of_each_tier() {
        let landed = LandedWrites::default();
        let start = Instant::now();
        let (a, b, gone) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
        landed.record(Tier::Checkpoint, [(a, start), (gone, start)]);
        landed.record(Tier::Row, [(a, start)]);
        landed.record(Tier::Checkpoint, [(a, start + Duration::from_secs(50))]);
        // An older snapshot landing late does not move the time back.
        landed.record(Tier::Checkpoint, [(a, start + Duration::from_secs(40))]);
        let now = start + Duration::from_secs(60);
        let ages = landed.measure(now, &[a, b]);
        assert_eq!(ages.residents, 2);
        assert_eq!(ages.checkpoint_worst, Duration::from_secs(10));
        assert_eq!(ages.row_worst, Duration::from_secs(60));
        // b was never saved: it counts from the first measure.
        let later = landed.measure(now + Duration::from_secs(5), &[b]);
        assert_eq!(later.checkpoint_worst, Duration::from_secs(5));
        assert_eq!(later.residents, 1);
        // Leavers are forgotten.
        assert_eq!(landed.by_character.lock().map(|m| m.len()).unwrap_or(0), 1);
    }

    fn request(epoch: i64, version: i64, at: Instant) -> crate::saver::SaveRequest {
        crate::saver::SaveRequest {
            reason: crate::saver::SaveReason::Checkpoint,
            snapshot: crate::character::CharacterSnapshot {
                character_id: Uuid::nil(),
                account_id: Uuid::nil(),
                name: "n".into(),
                zone_ref: None,
                room_ref: None,
                state: serde_json::json!({}).into(),
                chargen: None,
                state_version: version,
                owner_epoch: epoch,
                issue_mark: 0,
                schema_version: 1,
            },
            dumped_at: at,
        }
    }

    impl LandedWrites {
        fn raised(
            &self,
            request: &crate::saver::SaveRequest,
        ) -> Option<crate::character::CharacterSnapshot> {
            self.raised_many(std::slice::from_ref(request))
                .pop()
                .map(|(_, raised)| raised)
        }
    }

    #[test]
    fn a_checkpoint_dumped_after_a_landed_flush_goes_at_the_flushes_version() {
        let landed = LandedWrites::default();
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_millis(5);
        // The flush dumped at t0 (version 4) landed as version 5.
        landed.row_landed(&request(3, 4, t0), 5);
        // A checkpoint dumped at t1, before the copy heard of it, still says 4.
        let raised = landed.raised(&request(3, 4, t1));
        assert_eq!(raised.map(|s| s.state_version), Some(5));
        // One dumped before the flush stands; another copy's stands; one at 5 already stands.
        assert!(
            landed
                .raised(&request(3, 3, t0 - Duration::from_millis(1)))
                .is_none()
        );
        assert!(landed.raised(&request(4, 4, t1)).is_none());
        assert!(landed.raised(&request(3, 5, t1)).is_none());
    }

    #[test]
    fn p99_is_the_nearest_rank() {
        let mut ages: Vec<Duration> = (1..=200).map(Duration::from_secs).collect();
        assert_eq!(
            worst_and_p99(&mut ages),
            (Duration::from_secs(200), Duration::from_secs(198))
        );
        let mut one = vec![Duration::from_secs(3)];
        assert_eq!(
            worst_and_p99(&mut one),
            (Duration::from_secs(3), Duration::from_secs(3))
        );
        assert_eq!(worst_and_p99(&mut []), (Duration::ZERO, Duration::ZERO));
    }

    #[test]
    fn a_character_loaded_again_counts_from_its_load_not_its_earlier_stay() {
        let landed = LandedWrites::default();
        let start = Instant::now();
        let id = Uuid::now_v7();
        landed.record(Tier::Checkpoint, [(id, start)]);
        landed.record(Tier::Row, [(id, start)]);
        let later = start + Duration::from_secs(600);
        assert_eq!(
            landed.measure(later, &[id]).row_worst,
            Duration::from_secs(600),
            "as if it had stayed"
        );
        landed.loaded(id, later);
        let ages = landed.measure(later + Duration::from_secs(1), &[id]);
        assert_eq!(ages.row_worst, Duration::from_secs(1));
        assert_eq!(ages.checkpoint_worst, Duration::from_secs(1));
    }
}
