//! Checkpoint take-overs that arrive together are made together (through [`crate::batching`]):
//! the claims of a login storm answer a batch at a time, and their take-overs go as a few script
//! calls of many keys each instead of a call per login. A script call's own cost in Redis (about
//! 20 µs) is then paid once per call rather than once per player.

use std::sync::{Arc, LazyLock};

use redis::{Script, Value};

use super::checkpoint::{call_groups_of, guard_int};
use crate::backend::RedisBackend;
use crate::batching::{BatchOp, Batcher};
use crate::coord::handoff::is;

/// The take-over script's source: each claimant raises its key's guard to its epoch, keeping
/// the content.
const TAKE_SCRIPT: &str = concat!(
    include_str!("../lua/ints.lua"),
    include_str!("lua/checkpoint_take.lua")
);

static TAKE: LazyLock<Script> = LazyLock::new(|| Script::new(TAKE_SCRIPT));

/// Most round trips at once: the next batch gathers while these are in flight (a take-over
/// that waits past its loader's I/O bound loads the row instead).
const MOST_TAKING: usize = 4;
/// Most take-overs one batch carries (a pipeline of calls of [`TAKES_PER_CALL`] keys).
const MOST_KEYS: usize = 128;
/// Most take-overs one script call makes. Their documents' sizes are unknown until read, and a
/// call runs as one unit in Redis, copying every document it answers: a few to a call keep a
/// call of large documents short, and still pay a call's own cost once for several keys. (The
/// script answers the documents itself: a plain `HGET` sent after it, tried once, costs Redis a
/// little less but breaks while a cluster moves the slot — an `ASK` answer is followed by one
/// `ASKING`, so the script ran on the new node and raised the guard while the reads bounced
/// between the two nodes until the request failed, and the login loaded the row under a raised
/// guard.)
const TAKES_PER_CALL: usize = 8;

/// One take-over: the checkpoint's key, its claimant's epoch, the TTL it lives on for.
#[derive(Debug)]
pub(super) struct TakeRequest {
    pub(super) key: String,
    pub(super) claimant: i64,
    pub(super) ttl_ms: u64,
}

/// What one take-over found.
#[derive(Debug, Clone)]
pub(super) enum Taken {
    /// No checkpoint is stored.
    None,
    /// The stored value is not a checkpoint; why.
    Corrupt(String),
    /// The guard before the call and the stored snapshot's bytes.
    Held(i64, Vec<u8>),
}

/// One take-over's outcome; a failed round trip fails every take-over it carried.
pub(super) type TakeOutcome = Result<Taken, TakeFailure>;

/// Why a take-over has no answer.
#[derive(Debug, Clone)]
pub(super) enum TakeFailure {
    /// Redis failed or could not be reached.
    Redis(redis::RedisError),
    /// Redis answered something the script does not.
    Protocol(String),
}

/// The take-overs of one Redis deployment, batched.
pub(super) struct TakeOvers {
    redis: RedisBackend,
}

/// A checkpoint store's take-overs on `redis`.
pub(super) fn take_over_batcher(redis: RedisBackend) -> Arc<Batcher<TakeOvers>> {
    Batcher::new(TakeOvers { redis }, MOST_TAKING)
}

impl std::fmt::Debug for TakeOvers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TakeOvers").finish_non_exhaustive()
    }
}

impl BatchOp for TakeOvers {
    type Request = TakeRequest;
    type Outcome = TakeOutcome;

    fn fits(&self, batch: &[TakeRequest], next: &TakeRequest) -> bool {
        // One key once per batch (a pipeline's calls run in order; two claimants of one
        // character in two batches at once raise its guard in either order, to the higher).
        batch.len() < MOST_KEYS
            && batch[0].ttl_ms == next.ttl_ms
            && batch.iter().all(|r| r.key != next.key)
    }

    async fn run(&self, batch: &[TakeRequest]) -> Vec<TakeOutcome> {
        match self.take(batch).await {
            Ok(taken) => taken.into_iter().map(Ok).collect(),
            Err(failure) => batch.iter().map(|_| Err(failure.clone())).collect(),
        }
    }

    fn lost(&self) -> TakeOutcome {
        Err(TakeFailure::Protocol(
            "the take-over's task stopped before answering".into(),
        ))
    }
}

impl TakeOvers {
    /// One pipeline: a script call per group of keys sharing a slot (all of them on standalone
    /// Redis), confirmed like a write — a failover must not hand the old guard back to a
    /// zombie. A failed pipeline (an unconfirmed `WAIT`, a lost reply) may have run: the
    /// loader's retry of a take-over is answered the guard the first one found.
    async fn take(&self, batch: &[TakeRequest]) -> Result<Vec<Taken>, TakeFailure> {
        let keys: Vec<String> = batch.iter().map(|r| r.key.clone()).collect();
        let groups = call_groups_of(&keys, &[], self.redis.is_cluster(), TAKES_PER_CALL);
        let ttl_ms = batch.first().map_or(0, |r| r.ttl_ms);
        let mut calls = Vec::with_capacity(groups.len());
        for group in &groups {
            let mut call = TAKE.prepare_invoke();
            call.arg(ttl_ms);
            for &i in group {
                call.key(&batch[i].key).arg(batch[i].claimant);
            }
            calls.push(call);
        }
        // Sent without the script's text; a cache without it (a new master, a flush) gets it
        // loaded and the pipeline sent again. On a cluster the first sending may have run on
        // some nodes: their take-overs answer, the second time, the guard they first found.
        // (Loading first every time would send the script's text once per slot group.)
        let pipeline = |load: bool| {
            let mut pipe = redis::pipe();
            if load {
                pipe.load_script(&TAKE).ignore();
            }
            for call in &calls {
                pipe.invoke_script(call);
            }
            pipe
        };
        let replies: Vec<Vec<Vec<Value>>> = match self.redis.query_confirmed(pipeline(false)).await
        {
            Err(err) if err.code() == Some("NOSCRIPT") => {
                self.redis.query_confirmed(pipeline(true)).await
            }
            other => other,
        }
        .map_err(TakeFailure::Redis)?;
        if replies.len() != groups.len() {
            return Err(TakeFailure::Protocol(format!(
                "{} replies to {} calls",
                replies.len(),
                groups.len()
            )));
        }
        let mut taken: Vec<Option<Taken>> = vec![None; batch.len()];
        for (group, reply) in groups.iter().zip(replies) {
            if reply.len() != group.len() {
                return Err(TakeFailure::Protocol(format!(
                    "{} replies to a call of {}",
                    reply.len(),
                    group.len()
                )));
            }
            for (&i, one) in group.iter().zip(reply) {
                taken[i] = Some(decode(one)?);
            }
        }
        taken
            .into_iter()
            .map(|t| t.ok_or_else(|| TakeFailure::Protocol("a take-over without reply".into())))
            .collect()
    }
}

/// One key's reply.
fn decode(mut reply: Vec<Value>) -> Result<Taken, TakeFailure> {
    match reply.as_mut_slice() {
        [tag] if is(tag, "none") => Ok(Taken::None),
        [tag, Value::BulkString(why)] if is(tag, "corrupt") => {
            Ok(Taken::Corrupt(String::from_utf8_lossy(why).into_owned()))
        }
        [tag, Value::BulkString(guard), Value::BulkString(body)] if is(tag, "held") => {
            let guard =
                guard_int(guard).ok_or_else(|| TakeFailure::Protocol("take-over guard".into()))?;
            Ok(Taken::Held(guard, std::mem::take(body)))
        }
        other => Err(TakeFailure::Protocol(format!("{other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_decode_and_odd_ones_are_refused() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        assert!(matches!(decode(vec![bulk("none")]), Ok(Taken::None)));
        assert!(matches!(
            decode(vec![bulk("corrupt"), bulk("why")]),
            Ok(Taken::Corrupt(w)) if w == "why"
        ));
        assert!(matches!(
            decode(vec![bulk("held"), bulk("7"), bulk("{}")]),
            Ok(Taken::Held(7, body)) if body == b"{}"
        ));
        assert!(decode(vec![bulk("held"), bulk("07"), bulk("{}")]).is_err());
        assert!(decode(vec![bulk("held"), bulk("x"), bulk("{}")]).is_err());
        assert!(decode(vec![bulk("held")]).is_err());
        assert!(decode(vec![bulk("what")]).is_err());
        assert!(decode(vec![]).is_err());
    }
}
