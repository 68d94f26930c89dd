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
/// Most take-overs one script call makes (the documents are read outside the script, so a call
/// stays short however large they are).
const TAKES_PER_CALL: usize = 32;

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
    /// Redis), each followed by a plain `HGET` of its keys' documents, confirmed like a write — a
    /// failover must not hand the old guard back to a zombie. A failed pipeline (an unconfirmed
    /// `WAIT`, a lost reply) may have run: the loader's retry of a take-over is answered the
    /// guard the first one found.
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
        // (Loading first every time would send the script's text once per slot group.) Each
        // reply stands alone (`ignore_errors`): a key of another type fails its own `HGET`,
        // not the batch.
        let pipeline = |load: bool| {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            if load {
                pipe.load_script(&TAKE).ignore();
            }
            for (call, group) in calls.iter().zip(&groups) {
                pipe.invoke_script(call);
                for &i in group {
                    pipe.hget(&batch[i].key, "snapshot");
                }
            }
            pipe
        };
        let mut replies: Vec<Value> = self
            .redis
            .query_confirmed(pipeline(false))
            .await
            .map_err(TakeFailure::Redis)?;
        if replies.iter().any(is_noscript) {
            replies = self
                .redis
                .query_confirmed(pipeline(true))
                .await
                .map_err(TakeFailure::Redis)?;
        }
        scatter(batch.len(), &groups, replies)
    }
}

/// True for a reply saying the script is not in the server's cache.
fn is_noscript(reply: &Value) -> bool {
    matches!(reply, Value::ServerError(err) if err.code() == "NOSCRIPT")
}

/// Each take-over's answer, in request order, from the pipeline's replies: per group, the
/// script's reply and then one document per key.
fn scatter(
    requests: usize,
    groups: &[Vec<usize>],
    replies: Vec<Value>,
) -> Result<Vec<Taken>, TakeFailure> {
    let expected: usize = groups.iter().map(|g| 1 + g.len()).sum();
    if replies.len() != expected {
        return Err(TakeFailure::Protocol(format!(
            "{} replies to {expected} commands",
            replies.len()
        )));
    }
    let mut replies = replies.into_iter();
    let mut taken: Vec<Option<Taken>> = vec![None; requests];
    for group in groups {
        let answers = match replies.next() {
            Some(Value::Array(answers)) if answers.len() == group.len() => answers,
            Some(Value::ServerError(err)) => {
                return Err(TakeFailure::Redis(redis::RedisError::from(err)));
            }
            other => {
                return Err(TakeFailure::Protocol(format!(
                    "a call of {} answered {other:?}",
                    group.len()
                )));
            }
        };
        for (&i, answer) in group.iter().zip(answers) {
            let document = replies.next().unwrap_or(Value::Nil);
            taken[i] = Some(decode(answer, document)?);
        }
    }
    taken
        .into_iter()
        .map(|t| t.ok_or_else(|| TakeFailure::Protocol("a take-over without reply".into())))
        .collect()
}

/// One key's answer from the script and the `HGET` of its document that followed.
fn decode(answer: Value, document: Value) -> Result<Taken, TakeFailure> {
    let Value::Array(answer) = answer else {
        return Err(TakeFailure::Protocol(format!("{answer:?}")));
    };
    match answer.as_slice() {
        [tag] if is(tag, "none") => Ok(Taken::None),
        [tag, Value::BulkString(why)] if is(tag, "corrupt") => {
            Ok(Taken::Corrupt(String::from_utf8_lossy(why).into_owned()))
        }
        [tag, Value::BulkString(guard)] if is(tag, "held") => {
            let guard =
                guard_int(guard).ok_or_else(|| TakeFailure::Protocol("take-over guard".into()))?;
            match document {
                Value::BulkString(body) => Ok(Taken::Held(guard, body)),
                // Removed since the raise: only a later claim's copy could have removed it.
                Value::Nil => Ok(Taken::None),
                Value::ServerError(err) => Ok(Taken::Corrupt(format!(
                    "the document could not be read: {}",
                    err.details().unwrap_or(err.code())
                ))),
                other => Err(TakeFailure::Protocol(format!("take-over body {other:?}"))),
            }
        }
        other => Err(TakeFailure::Protocol(format!("{other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn answer(parts: &[&str]) -> Value {
        Value::Array(parts.iter().map(|p| bulk(p)).collect())
    }

    #[test]
    fn replies_decode_and_odd_ones_are_refused() {
        assert!(matches!(
            decode(answer(&["none"]), Value::Nil),
            Ok(Taken::None)
        ));
        assert!(matches!(
            decode(answer(&["corrupt", "why"]), Value::Nil),
            Ok(Taken::Corrupt(w)) if w == "why"
        ));
        assert!(matches!(
            decode(answer(&["held", "7"]), bulk("{}")),
            Ok(Taken::Held(7, body)) if body == b"{}"
        ));
        // Removed between the raise and the read: nothing is held.
        assert!(matches!(
            decode(answer(&["held", "7"]), Value::Nil),
            Ok(Taken::None)
        ));
        assert!(decode(answer(&["held", "07"]), bulk("{}")).is_err());
        assert!(decode(answer(&["held", "x"]), bulk("{}")).is_err());
        assert!(decode(answer(&["held"]), bulk("{}")).is_err());
        assert!(decode(answer(&["held", "7"]), Value::Int(3)).is_err());
        assert!(decode(answer(&["what"]), Value::Nil).is_err());
        assert!(decode(answer(&[]), Value::Nil).is_err());
        assert!(decode(bulk("held"), Value::Nil).is_err());
    }

    #[test]
    fn answers_go_back_to_their_requests_and_a_short_reply_fails_the_batch() {
        // Requests 0 and 2 share a call; request 1 has its own.
        let groups = vec![vec![0, 2], vec![1]];
        let replies = vec![
            Value::Array(vec![answer(&["held", "4"]), answer(&["none"])]),
            bulk("zero"),
            Value::Nil,
            Value::Array(vec![answer(&["held", "9"])]),
            bulk("one"),
        ];
        let taken = scatter(3, &groups, replies.clone()).unwrap();
        assert!(matches!(&taken[0], Taken::Held(4, b) if b == b"zero"));
        assert!(matches!(&taken[1], Taken::Held(9, b) if b == b"one"));
        assert!(matches!(&taken[2], Taken::None));
        let mut short = replies.clone();
        short.pop();
        assert!(scatter(3, &groups, short).is_err());
        let mut misshapen = replies;
        misshapen[0] = Value::Array(vec![answer(&["none"])]);
        assert!(scatter(3, &groups, misshapen).is_err());
    }
}
