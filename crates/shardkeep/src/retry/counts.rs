//! How many retry jobs wait and how many are leased, read at a cost that does not grow with the
//! queue: exact while it holds at most [`EXACT_UP_TO`] jobs; beyond that the total is Postgres's
//! live-row count of the table (its statistics, kept as rows come and go). Leased jobs are
//! always counted exactly, through their own partial index (migration 15).

use super::job_tx::JobStore;

/// Queues up to this many jobs are counted exactly.
pub(crate) const EXACT_UP_TO: i64 = 10_000;

/// Jobs in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct JobCounts {
    /// Waiting for a worker (due or not).
    pub(crate) pending: i64,
    /// Under a worker's lease.
    pub(crate) leased: i64,
}

/// Counts the queue's jobs in one statement: on Postgres a scan of at most [`EXACT_UP_TO`] + 1
/// rows, the leased index, and the table's statistics row; the embedded store (which keeps no
/// statistics) counts exactly.
pub(crate) async fn job_counts(jobs: &JobStore) -> Result<JobCounts, sqlx::Error> {
    let pg = match jobs {
        JobStore::Postgres(pg) => pg,
        JobStore::Embedded(db) => {
            let (total, leased): (i64, i64) =
                sqlx::query_as("SELECT count(*), count(lease_token) FROM persistence_retry_jobs")
                    .fetch_one(db.reader()?)
                    .await?;
            return Ok(from_parts(total, leased, Some(total)));
        }
    };
    let (seen, leased, live): (i64, i64, Option<i64>) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM (SELECT 1 FROM persistence_retry_jobs LIMIT $1) s),
                (SELECT count(*) FROM persistence_retry_jobs WHERE lease_token IS NOT NULL),
                (SELECT n_live_tup FROM pg_stat_user_tables
                  WHERE relid = 'persistence_retry_jobs'::regclass)",
    )
    .bind(EXACT_UP_TO + 1)
    .fetch_one(pg.exec())
    .await?;
    Ok(from_parts(seen, leased, live))
}

/// The counts from the bounded scan (`seen` rows), the exact leased count and the table's
/// live-row statistic.
fn from_parts(seen: i64, leased: i64, live: Option<i64>) -> JobCounts {
    let total = if seen <= EXACT_UP_TO {
        seen
    } else {
        live.unwrap_or(0).max(seen)
    };
    JobCounts {
        pending: (total - leased).max(0),
        leased,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_queue_is_counted_exactly_whatever_the_statistics_say() {
        assert_eq!(
            from_parts(120, 20, Some(5_000_000)),
            JobCounts {
                pending: 100,
                leased: 20
            }
        );
    }

    #[test]
    fn a_large_queue_takes_its_total_from_the_statistics_never_below_what_was_seen() {
        let seen = EXACT_UP_TO + 1;
        assert_eq!(from_parts(seen, 10, Some(1_000_000)).pending, 999_990);
        assert_eq!(from_parts(seen, 10, Some(50)).pending, seen - 10);
        assert_eq!(from_parts(seen, 10, None).pending, seen - 10);
    }

    #[test]
    fn pending_never_goes_below_zero() {
        assert_eq!(from_parts(3, 5, None).pending, 0);
    }
}
