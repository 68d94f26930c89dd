//! The save cadences (pure): a checkpoint every ~10 s and a flush every ~60 s per live copy,
//! staggered so a shard's saves spread evenly over the pulses instead of arriving together, and
//! the rules a configuration must keep.

use std::ops::RangeInclusive;
use std::time::Duration;

use tokio::time::Instant;

use uuid::Uuid;

use crate::saver::SaveReason;

/// How often the runtime saves each live copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cadence {
    /// The runtime's pulse: how often it looks for copies that are due (the seeds' 250 ms).
    pub pulse: Duration,
    /// Between two checkpoints of a copy (Redis): the crash window.
    pub checkpoint_every: Duration,
    /// Between two flushes of a copy (Postgres).
    pub flush_every: Duration,
}

impl Default for Cadence {
    fn default() -> Self {
        Self {
            pulse: Duration::from_millis(250),
            checkpoint_every: Duration::from_secs(10),
            flush_every: Duration::from_secs(60),
        }
    }
}

/// A cadence the runtime refuses to run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CadenceError {
    /// The pulse is zero, or longer than the checkpoint period.
    #[error(
        "the pulse ({pulse:?}) must be above zero and at most the checkpoint period ({checkpoint:?})"
    )]
    Pulse {
        /// The pulse given.
        pulse: Duration,
        /// The checkpoint period given.
        checkpoint: Duration,
    },
    /// Flushes come more often than checkpoints (every flush writes a checkpoint too).
    #[error("the flush period ({flush:?}) must be at least the checkpoint period ({checkpoint:?})")]
    FlushBeforeCheckpoint {
        /// The flush period given.
        flush: Duration,
        /// The checkpoint period given.
        checkpoint: Duration,
    },
    /// A checkpoint would expire before the copy writes enough new ones: one missed cadence
    /// (Redis cut for a moment) would leave the copy with no checkpoint, and a crash then rolls
    /// it back to the row.
    #[error(
        "checkpoints live {ttl:?}: the checkpoint period ({checkpoint:?}) must be at most a \
         quarter of that, and the flush period ({flush:?}) at most half"
    )]
    OutlivesCheckpoints {
        /// The checkpoint TTL.
        ttl: Duration,
        /// The checkpoint period given.
        checkpoint: Duration,
        /// The flush period given.
        flush: Duration,
    },
}

impl Cadence {
    /// Checkpoints every `checkpoint_every` and flushes every `flush_every` (at least as long),
    /// on a pulse of a quarter of the checkpoint period, between 10 and 250 ms.
    pub fn new(checkpoint_every: Duration, flush_every: Duration) -> Self {
        Self {
            pulse: (checkpoint_every / 4)
                .clamp(Duration::from_millis(10), Duration::from_millis(250)),
            checkpoint_every,
            flush_every: flush_every.max(checkpoint_every),
        }
    }

    /// Refuses a cadence whose checkpoints would lapse between writes (`ttl`: how long the
    /// checkpoint tier keeps one), or whose periods are out of order.
    pub fn validate(&self, ttl: Duration) -> Result<(), CadenceError> {
        let (pulse, checkpoint, flush) = (self.pulse, self.checkpoint_every, self.flush_every);
        if pulse.is_zero() || pulse > checkpoint {
            return Err(CadenceError::Pulse { pulse, checkpoint });
        }
        if flush < checkpoint {
            return Err(CadenceError::FlushBeforeCheckpoint { flush, checkpoint });
        }
        if checkpoint > ttl / 4 || flush > ttl / 2 {
            return Err(CadenceError::OutlivesCheckpoints {
                ttl,
                checkpoint,
                flush,
            });
        }
        Ok(())
    }

    /// The pulse the cadences count in (a game pulsing the runtime itself ticks at this rate;
    /// a tick that comes late stands in for the pulses it missed).
    pub fn pulse(&self) -> Duration {
        self.pulse
    }

    /// The periods in pulses (checkpoint, flush), each at least one.
    pub fn periods(&self) -> (u64, u64) {
        (
            self.pulses_in(self.checkpoint_every),
            self.pulses_in(self.flush_every),
        )
    }

    /// Whole pulses in `span`, at least one.
    pub(crate) fn pulses_in(&self, span: Duration) -> u64 {
        self.whole_pulses(span).max(1)
    }

    /// Numbers a pulse run at `now`, the pulse clock standing at `clock` (the last pulse's
    /// number and the time it stands at): this pulse's number and the clock after it. A pulse
    /// on time or early is the next number. A late one stands for the whole pulses elapsed
    /// since the time the clock stands at, so the periods keep their length in time (the
    /// remainder is kept for the next pulse), at most [`MOST_STOOD_FOR`]: a longer gap (a
    /// stalled or too slow tick, a suspended host) is forgiven rather than owed all at once,
    /// the cadences stretching by it, and the clock moves to now. The clock never runs ahead
    /// of now, so a tick faster than the pulse banks no time.
    pub(crate) fn advance(
        &self,
        (previous, stood_at): PulseClock,
        now: Instant,
    ) -> (u64, PulseClock) {
        let late = self.whole_pulses(now.saturating_duration_since(stood_at));
        let (stands_for, moved_to) = match late {
            0 | 1 => (1, stood_at.checked_add(self.pulse)),
            late if late <= MOST_STOOD_FOR => (
                late,
                u32::try_from(late)
                    .ok()
                    .and_then(|k| self.pulse.checked_mul(k))
                    .and_then(|span| stood_at.checked_add(span)),
            ),
            _ => (MOST_STOOD_FOR, Some(now)),
        };
        let n = previous.saturating_add(stands_for);
        (n, (n, moved_to.map_or(now, |t| t.min(now))))
    }

    fn whole_pulses(&self, span: Duration) -> u64 {
        let n = span.as_nanos() / self.pulse.as_nanos().max(1);
        u64::try_from(n).unwrap_or(u64::MAX)
    }
}

/// The pulse clock: the number of the last pulse run and the time it stands at.
pub(crate) type PulseClock = (u64, Instant);

/// The most pulses one late pulse stands for (their saves, their refreshes): a pulse running up
/// to this many pulses late keeps the cadences in time; a longer pause stretches them by the
/// rest instead of piling it on one pulse.
pub(crate) const MOST_STOOD_FOR: u64 = 4;

/// True when the pulses after `from` up to `to` include a multiple of `every`: what runs once
/// every `every` pulses runs on a late pulse that stands in for the one it was due on.
pub(crate) fn passes_multiple(from: u64, to: u64, every: u64) -> bool {
    let every = every.max(1);
    to / every > from / every
}

/// A copy's fixed places in both periods: the pulses it is due on, from its id, so copies of one
/// shard spread evenly and a copy keeps its place for as long as it lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Phase {
    checkpoint: u64,
    flush: u64,
    spread: u64,
}

impl Phase {
    /// The phase of `character_id` for periods of `(checkpoint, flush)` pulses. When the flush
    /// period is a whole number of checkpoint periods (the default's six), the flush falls on
    /// one of the copy's checkpoint pulses and takes its place: a flush writes both tiers, so a
    /// checkpoint beside it would write the same snapshot's tier twice.
    pub fn of(character_id: Uuid, (checkpoint, flush): (u64, u64)) -> Self {
        let (hi, lo) = character_id.as_u64_pair();
        let spread = mix(hi ^ mix(lo));
        let (checkpoint, flush) = (checkpoint.max(1), flush.max(1));
        let checkpoint_phase = spread % checkpoint;
        let flush_phase = if flush.is_multiple_of(checkpoint) {
            checkpoint_phase + checkpoint * (mix(spread) % (flush / checkpoint))
        } else {
            mix(spread) % flush
        };
        Self {
            checkpoint: checkpoint_phase,
            flush: flush_phase,
            spread: mix(spread.rotate_left(21)),
        }
    }

    /// True on the pulses, one in `every`, on which the copy's session records are refreshed.
    pub fn refresh_due(&self, pulse: u64, every: u64) -> bool {
        self.refresh_due_within(pulse..=pulse, every)
    }

    /// True when a refresh of the copy's session records falls on one of `pulses` (a late
    /// pulse stands in for the pulses it missed).
    pub fn refresh_due_within(&self, pulses: RangeInclusive<u64>, every: u64) -> bool {
        falls_within(&pulses, every, self.spread)
    }

    /// The first pulse after `after` on which the copy is due for anything: a save (`periods`:
    /// checkpoint and flush, as [`Phase::due`] takes them) or, one pulse in `refresh`, its
    /// session records. The runtime's pulse looks at a copy only on those pulses (or on the
    /// first pulse run after one, when pulses come late).
    pub fn next_visit(&self, after: u64, (checkpoint, flush): (u64, u64), refresh: u64) -> u64 {
        let from = after.saturating_add(1);
        first_from(from, checkpoint, self.checkpoint)
            .min(first_from(from, flush, self.flush))
            .min(first_from(from, refresh, self.spread))
    }

    /// What the copy is due for on `pulse`: a flush once per flush period, a checkpoint once per
    /// checkpoint period, the flush when both fall on one pulse (it writes both tiers).
    pub fn due(&self, pulse: u64, periods: (u64, u64)) -> Option<SaveReason> {
        self.due_within(pulse..=pulse, periods)
    }

    /// The widest save due on any of `pulses` (a late pulse stands in for the pulses it
    /// missed): the flush when one falls among them, else a checkpoint when one does.
    pub fn due_within(
        &self,
        pulses: RangeInclusive<u64>,
        (checkpoint, flush): (u64, u64),
    ) -> Option<SaveReason> {
        if falls_within(&pulses, flush, self.flush) {
            Some(SaveReason::Flush)
        } else if falls_within(&pulses, checkpoint, self.checkpoint) {
            Some(SaveReason::Checkpoint)
        } else {
            None
        }
    }
}

/// The first pulse from `from` on that is `offset` short of a multiple of `every` (the pulses a
/// copy's place in a period of `every` falls on).
fn first_from(from: u64, every: u64, offset: u64) -> u64 {
    let every = every.max(1);
    let wait = (every - (from % every + offset % every) % every) % every;
    from.saturating_add(wait)
}

/// True when a pulse of `pulses` is `offset` short of a multiple of `every`.
fn falls_within(pulses: &RangeInclusive<u64>, every: u64, offset: u64) -> bool {
    !pulses.is_empty() && first_from(*pulses.start(), every, offset) <= *pulses.end()
}

/// The splitmix64 finalizer: ids made close together (time-ordered ones share their leading
/// bits, counters their trailing ones) land on unrelated phases.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_pulse_stands_for_the_pulses_it_missed_up_to_a_bound() {
        let cadence = Cadence::default();
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        // On time: the next number, the clock a pulse on.
        assert_eq!(
            cadence.advance((7, t0), t0 + ms(260)),
            (8, (8, t0 + ms(250)))
        );
        // Early (a tick faster than the pulse): the next number, the clock no further than now.
        assert_eq!(cadence.advance((7, t0), t0 + ms(10)), (8, (8, t0 + ms(10))));
        // Late: the whole pulses elapsed, the remainder kept for the next pulse.
        assert_eq!(
            cadence.advance((7, t0), t0 + ms(620)),
            (9, (9, t0 + ms(500)))
        );
        assert_eq!(
            cadence.advance((7, t0), t0 + ms(1_000)),
            (11, (11, t0 + ms(1_000)))
        );
        assert_eq!(
            cadence.advance((7, t0), t0 + ms(1_100)),
            (11, (11, t0 + ms(1_000)))
        );
        // Five pulses or more: four, the rest forgiven, the clock at now.
        assert_eq!(
            cadence.advance((7, t0), t0 + ms(1_300)),
            (11, (11, t0 + ms(1_300)))
        );
        assert_eq!(
            cadence.advance((7, t0), t0 + ms(30_000)),
            (11, (11, t0 + ms(30_000)))
        );
        assert_eq!(cadence.advance((u64::MAX, t0), t0 + ms(600)).0, u64::MAX);
    }

    #[test]
    fn a_steadily_late_tick_keeps_the_clocks_count_and_a_fast_one_banks_nothing() {
        let cadence = Cadence::default();
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        // 400 ticks 255 ms apart (102 s): the numbers keep up with the clock's 408 pulses.
        let mut clock = (0, t0);
        for tick in 1..=400u32 {
            clock = cadence.advance(clock, t0 + ms(255) * tick).1;
        }
        assert!((406..=408).contains(&clock.0), "{}", clock.0);
        // 600 ticks 10 ms apart, then one 2 s later: it stands for four, not for one.
        let mut clock = (0, t0);
        for tick in 1..=600u32 {
            clock = cadence.advance(clock, t0 + ms(10) * tick).1;
        }
        assert_eq!(clock, (600, t0 + ms(6_000)));
        assert_eq!(cadence.advance(clock, t0 + ms(8_000)).0, 604);
    }

    #[test]
    fn a_span_of_pulses_is_due_for_what_falls_on_any_of_them() {
        let periods = (40, 240);
        for n in 0..200u128 {
            let phase = Phase::of(Uuid::from_u128(n * 7919), periods);
            for (from, to) in [(0, 0), (3, 50), (100, 139), (17, 300), (239, 480)] {
                let widest = (from..=to)
                    .filter_map(|p| phase.due(p, periods))
                    .max_by_key(|r| matches!(r, SaveReason::Flush));
                assert_eq!(
                    phase.due_within(from..=to, periods),
                    widest,
                    "{from}..={to}"
                );
                let refreshed = (from..=to).any(|p| phase.refresh_due(p, 160));
                assert_eq!(phase.refresh_due_within(from..=to, 160), refreshed);
            }
        }
        let phase = Phase::of(Uuid::from_u128(1), periods);
        assert_eq!(
            phase.due_within(std::ops::RangeInclusive::new(5, 4), periods),
            None
        );
        assert!(!phase.refresh_due_within(RangeInclusive::new(u64::MAX, 0), 160));
    }

    #[test]
    fn a_multiple_passed_over_by_a_late_pulse_counts() {
        assert!(passes_multiple(39, 40, 40));
        assert!(passes_multiple(38, 45, 40), "40 was stood in for");
        assert!(!passes_multiple(40, 79, 40));
        assert!(passes_multiple(40, 200, 40));
        assert!(!passes_multiple(5, 5, 40));
        assert!(passes_multiple(5, 6, 0), "a period of zero is one pulse");
    }

    #[test]
    fn the_default_cadence_is_the_seeds_and_fits_an_hours_checkpoint() {
        let cadence = Cadence::default();
        assert_eq!(cadence.periods(), (40, 240));
        assert_eq!(cadence.validate(Duration::from_secs(3600)), Ok(()));
    }

    #[test]
    fn a_cadence_from_its_periods_pulses_a_quarter_of_a_checkpoint_within_bounds() {
        let ms = Duration::from_millis;
        assert_eq!(Cadence::new(ms(200), ms(1000)).pulse, ms(50));
        assert_eq!(Cadence::new(ms(10_000), ms(60_000)), Cadence::default());
        assert_eq!(Cadence::new(ms(20), ms(10)).pulse, ms(10));
        assert_eq!(Cadence::new(ms(20), ms(10)).flush_every, ms(20));
    }

    #[test]
    fn cadences_that_outlive_their_checkpoints_or_run_backwards_are_refused() {
        let ttl = Duration::from_secs(3600);
        let mut cadence = Cadence {
            checkpoint_every: Duration::from_secs(901),
            flush_every: Duration::from_secs(1200),
            ..Cadence::default()
        };
        assert!(matches!(
            cadence.validate(ttl),
            Err(CadenceError::OutlivesCheckpoints { .. })
        ));
        cadence.checkpoint_every = Duration::from_secs(60);
        cadence.flush_every = Duration::from_secs(1801);
        assert!(matches!(
            cadence.validate(ttl),
            Err(CadenceError::OutlivesCheckpoints { .. })
        ));
        cadence.flush_every = Duration::from_secs(30);
        assert!(matches!(
            cadence.validate(ttl),
            Err(CadenceError::FlushBeforeCheckpoint { .. })
        ));
        cadence.flush_every = Duration::from_secs(60);
        cadence.pulse = Duration::ZERO;
        assert!(matches!(
            cadence.validate(ttl),
            Err(CadenceError::Pulse { .. })
        ));
        cadence.pulse = Duration::from_secs(61);
        assert!(matches!(
            cadence.validate(ttl),
            Err(CadenceError::Pulse { .. })
        ));
    }

    #[test]
    fn the_next_visit_is_the_first_pulse_with_a_save_or_a_refresh_due() {
        for (periods, refresh) in [((40, 240), 160), ((40, 250), 160), ((4, 8), 1), ((7, 7), 3)] {
            for _ in 0..100 {
                let phase = Phase::of(Uuid::now_v7(), periods);
                let due = |p: u64| phase.due(p, periods).is_some() || phase.refresh_due(p, refresh);
                for after in [0, 1, 39, 40, 239, 240, 1_000_003] {
                    let expected = (after + 1..).find(|p| due(*p));
                    assert_eq!(
                        Some(phase.next_visit(after, periods, refresh)),
                        expected,
                        "{phase:?} after {after} with {periods:?}/{refresh}"
                    );
                }
            }
        }
    }

    #[test]
    fn periods_that_do_not_divide_keep_a_flush_beside_the_checkpoints() {
        let periods = (40, 250);
        for _ in 0..200 {
            let phase = Phase::of(Uuid::now_v7(), periods);
            let dues: Vec<Option<SaveReason>> = (0..250 * 40)
                .map(|pulse| phase.due(pulse, periods))
                .collect();
            let flushes = dues
                .iter()
                .filter(|d| **d == Some(SaveReason::Flush))
                .count();
            assert_eq!(flushes, 40, "one flush per flush period");
            let saves: Vec<usize> = (0..dues.len()).filter(|p| dues[*p].is_some()).collect();
            assert!(saves.windows(2).all(|w| w[1] - w[0] <= 40), "{saves:?}");
        }
    }

    #[test]
    fn every_copy_is_flushed_once_and_checkpointed_every_period_and_shards_spread() {
        let periods = (40, 240);
        let copies: Vec<Uuid> = (0..2000).map(|_| Uuid::now_v7()).collect();
        let mut per_pulse = vec![0usize; 240];
        for id in &copies {
            let phase = Phase::of(*id, periods);
            let dues: Vec<Option<SaveReason>> =
                (0..240).map(|pulse| phase.due(pulse, periods)).collect();
            let flushes = dues
                .iter()
                .filter(|d| **d == Some(SaveReason::Flush))
                .count();
            assert_eq!(flushes, 1, "one flush per flush period");
            // Between two saves never more than a checkpoint period.
            let saves: Vec<usize> = (0..240 * 2)
                .filter(|p| phase.due(*p as u64, periods).is_some())
                .collect();
            assert!(saves.windows(2).all(|w| w[1] - w[0] <= 40), "{saves:?}");
            for (pulse, due) in dues.iter().enumerate() {
                if due.is_some() {
                    per_pulse[pulse] += 1;
                }
            }
        }
        // 2000 copies, each saved 6 times per 240 pulses (a flush in place of one of its six
        // checkpoints): 50 a pulse on average.
        assert_eq!(
            per_pulse.iter().sum::<usize>(),
            2000 * 6,
            "a flush replaces a checkpoint"
        );
        let (low, high) = (
            per_pulse.iter().min().copied().unwrap_or(0),
            per_pulse.iter().max().copied().unwrap_or(0),
        );
        assert!(low >= 20 && high <= 90, "uneven: {low}..{high}");
    }
}
