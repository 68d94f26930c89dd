//! One connection type over the two Redis topologies: a standalone server (reconnecting
//! multiplexed link) or a Redis Cluster (redis-rs's cluster client, which follows MOVED and ASK
//! and reconnects to failed-over masters). Every adapter issues its commands, scripts and
//! pipelines through it, unaware of the topology.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::cluster_link::ClusterLink;

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, SlotAddr};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

/// A cheap-to-clone Redis connection, standalone or cluster. Every connection of a
/// [`RedisBackend`](super::redis::RedisBackend) shares its handle's closed flag: once the
/// handle is closed, each command on any of them fails at once without reaching the server.
#[derive(Clone)]
pub struct RedisConn {
    link: Link,
    gate: Arc<Gate>,
}

/// What every connection of one handle shares: whether the handle was closed, and how many
/// commands are on their way (so a closer can wait for them to land before it looks).
#[derive(Debug, Default)]
pub(crate) struct Gate {
    closed: AtomicBool,
    in_flight: AtomicUsize,
}

impl Gate {
    /// Closes the gate: commands not yet let through are refused.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    /// True once closed.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Commands let through and not yet answered.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Lets one command through, counted until the answer is dropped; refused once closed (a
    /// command counted before the close is seen by the closer's wait).
    fn enter(self: &Arc<Self>) -> Result<Passage, redis::RedisError> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let passage = Passage(Arc::clone(self));
        if self.is_closed() {
            return Err(closed_error());
        }
        Ok(passage)
    }
}

/// One command let through a [`Gate`].
struct Passage(Arc<Gate>);

impl Drop for Passage {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How a [`RedisConn`] reaches the deployment.
#[derive(Clone)]
pub(crate) enum Link {
    /// A standalone server through a reconnecting multiplexed link.
    Standalone(ConnectionManager),
    /// One node of a cluster addressed directly (SCAN and configuration checks per master).
    Node(MultiplexedConnection),
    /// A Redis Cluster: commands are routed by the slot of their keys.
    Cluster(Arc<ClusterLink>),
}

impl RedisConn {
    /// A connection over `link`, refused once `gate` is closed.
    pub(crate) fn new(link: Link, gate: &Arc<Gate>) -> Self {
        Self {
            link,
            gate: Arc::clone(gate),
        }
    }
}

/// What a command on a closed handle answers.
pub(crate) fn closed_error() -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Client,
        "refused",
        "this Redis handle was closed".to_owned(),
    ))
}

impl std::fmt::Debug for RedisConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.link {
            Link::Standalone(_) => "RedisConn::Standalone",
            Link::Node(_) => "RedisConn::Node",
            Link::Cluster(_) => "RedisConn::Cluster",
        })
    }
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let _passage = self.gate.enter()?;
            let reply = match &mut self.link {
                Link::Standalone(conn) => conn.req_packed_command(cmd).await,
                Link::Node(conn) => conn.req_packed_command(cmd).await,
                Link::Cluster(link) => {
                    let (generation, mut conn) = link.get();
                    let reply = conn.req_packed_command(cmd).await;
                    match &reply {
                        Ok(_) => link.after_ok(),
                        Err(err) => link.after_error(generation, err).await,
                    }
                    reply
                }
            };
            if let Err(err) = &reply {
                count_oom(err.code());
            }
            reply
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let _passage = self.gate.enter()?;
            let replies = match &mut self.link {
                Link::Standalone(conn) => conn.req_packed_commands(pipeline, offset, count).await,
                Link::Node(conn) => conn.req_packed_commands(pipeline, offset, count).await,
                Link::Cluster(link) => {
                    let (generation, mut conn) = link.get();
                    let replies = cluster_pipeline(&mut conn, pipeline, offset, count).await;
                    match &replies {
                        Ok(_) => link.after_ok(),
                        Err(err) => link.after_error(generation, err).await,
                    }
                    replies
                }
            };
            match &replies {
                Err(err) => count_oom(err.code()),
                Ok(values) => {
                    for value in values {
                        if let Value::ServerError(err) = value {
                            count_oom(Some(err.code()));
                        }
                    }
                }
            }
            replies
        })
    }

    fn get_db(&self) -> i64 {
        match &self.link {
            Link::Standalone(conn) => conn.get_db(),
            Link::Node(conn) => conn.get_db(),
            Link::Cluster(link) => link.get().1.get_db(),
        }
    }
}

/// Counts a refusal for lack of memory: under `noeviction` a full Redis answers writes with
/// `OOM`, which the alerts watch.
fn count_oom(code: Option<&str>) {
    if code == Some("OOM") {
        metrics::counter!(crate::telemetry::REDIS_OOM_ERRORS_TOTAL).increment(1);
    }
}

/// Where one command of a pipeline must go on a cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placement {
    /// The master of one slot.
    Slot(Route),
    /// Anywhere (no key), or every node (`SCRIPT LOAD`): sent along with every slot's group.
    Everywhere,
}

/// Commands that name no key (sent along with every slot's group).
const KEYLESS: &[&str] = &[
    "SCRIPT", "PING", "ECHO", "TIME", "INFO", "CONFIG", "CLUSTER", "DBSIZE", "FUNCTION", "WAIT",
];
/// Commands whose every argument after the name is a key.
const ALL_KEYS: &[&str] = &["DEL", "UNLINK", "EXISTS", "TOUCH", "MGET"];

fn placement(cmd: &Cmd) -> RedisResult<Placement> {
    let args: Vec<&[u8]> = cmd
        .args_iter()
        .filter_map(|arg| match arg {
            redis::Arg::Simple(bytes) => Some(bytes),
            _ => None,
        })
        .collect();
    let name = args
        .first()
        .map(|n| String::from_utf8_lossy(n).to_ascii_uppercase())
        .unwrap_or_default();
    let keys: &[&[u8]] = if KEYLESS.contains(&name.as_str()) {
        &[]
    } else if name.starts_with("EVAL") || name.starts_with("FCALL") {
        let count: usize = args
            .get(2)
            .and_then(|n| std::str::from_utf8(n).ok())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        args.get(3..3 + count).unwrap_or(&[])
    } else if ALL_KEYS.contains(&name.as_str()) {
        args.get(1..).unwrap_or(&[])
    } else {
        args.get(1..2).unwrap_or(&[])
    };
    let mut routes = keys.iter().map(|k| Route::with_key(k, SlotAddr::Master));
    let Some(first) = routes.next() else {
        return Ok(Placement::Everywhere);
    };
    if routes.any(|r| r != first) {
        return Err((
            redis::ErrorKind::Server(redis::ServerErrorKind::CrossSlot),
            "a pipelined command names keys of several slots",
        )
            .into());
    }
    Ok(Placement::Slot(first))
}

/// Runs a pipeline on a cluster. One whose keyed commands share a slot goes out as it is; one
/// spanning slots (a batch of checkpoints of many characters, say) is split into one pipeline
/// per slot, sent together, and the replies are put back in the pipeline's order. Commands with
/// no key (`SCRIPT LOAD`, `WAIT`) go with every group, so a script loaded ahead of its calls is on every
/// node that runs them. A transaction must stay in one slot and is never split.
async fn cluster_pipeline(
    conn: &mut ClusterConnection,
    pipeline: &Pipeline,
    offset: usize,
    count: usize,
) -> RedisResult<Vec<Value>> {
    if pipeline.is_transaction() {
        return conn.req_packed_commands(pipeline, offset, count).await;
    }
    let placements: Vec<Placement> = pipeline
        .cmd_iter()
        .map(placement)
        .collect::<Result<_, _>>()?;
    let groups = group_by_slot(&placements);
    if groups.len() <= 1 {
        return conn.req_packed_commands(pipeline, offset, count).await;
    }
    let commands: Vec<&Cmd> = pipeline.cmd_iter().collect();
    let sends = groups.iter().map(|members| {
        let mut part = redis::pipe();
        for &i in members {
            if let Some(cmd) = commands.get(i) {
                part.add_command((*cmd).clone());
            }
        }
        let mut conn = conn.clone();
        async move {
            let len = part.cmd_iter().count();
            conn.req_packed_commands(&part, 0, len).await
        }
    });
    let replies = futures::future::try_join_all(sends).await?;
    let waits: Vec<bool> = commands.iter().map(|cmd| is_wait(cmd)).collect();
    let mut merged: Vec<Option<Value>> = vec![None; commands.len()];
    for (members, values) in groups.iter().zip(replies) {
        for (&i, value) in members.iter().zip(values) {
            let wait = waits.get(i).copied().unwrap_or(false);
            if let Some(slot) = merged.get_mut(i) {
                *slot = Some(match slot.take() {
                    None => value,
                    Some(kept) if wait => fewest_acks(kept, value),
                    Some(kept) => kept,
                });
            }
        }
    }
    merged
        .into_iter()
        .map(|v| {
            v.ok_or_else(|| (redis::ErrorKind::Client, "a split pipeline came back short").into())
        })
        .collect()
}

fn is_wait(cmd: &Cmd) -> bool {
    matches!(cmd.args_iter().next(), Some(redis::Arg::Simple(name)) if name.eq_ignore_ascii_case(b"WAIT"))
}

/// A `WAIT` sent with every group of a split pipeline answers once per master: the pipeline's
/// writes are as replicated as on the master that reached the fewest replicas.
fn fewest_acks(a: Value, b: Value) -> Value {
    match (&a, &b) {
        (Value::Int(x), Value::Int(y)) => Value::Int((*x).min(*y)),
        (Value::Int(_), _) => b,
        _ => a,
    }
}

/// Indices of the commands each slot's pipeline carries, in pipeline order: its own commands and
/// every keyless one. Groups are ordered by their first keyed command.
fn group_by_slot(placements: &[Placement]) -> Vec<Vec<usize>> {
    let mut order: Vec<Route> = Vec::new();
    let mut keyed: HashMap<Route, ()> = HashMap::new();
    for p in placements {
        if let Placement::Slot(route) = p
            && keyed.insert(*route, ()).is_none()
        {
            order.push(*route);
        }
    }
    order
        .iter()
        .map(|route| {
            placements
                .iter()
                .enumerate()
                .filter(|(_, p)| match p {
                    Placement::Slot(r) => r == route,
                    Placement::Everywhere => true,
                })
                .map(|(i, _)| i)
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(key: &str) -> Placement {
        Placement::Slot(Route::with_key(key, SlotAddr::Master))
    }

    #[test]
    fn keyed_commands_group_by_slot_and_keyless_ones_join_every_group() {
        let placements = [
            Placement::Everywhere,
            route("{a}x"),
            route("{b}x"),
            route("{a}y"),
        ];
        assert_eq!(group_by_slot(&placements), vec![vec![0, 1, 3], vec![0, 2]]);
    }

    #[test]
    fn a_split_wait_reports_the_fewest_acknowledgements() {
        let mut wait = redis::cmd("WAIT");
        wait.arg(1).arg(100);
        assert!(is_wait(&wait));
        assert!(!is_wait(&redis::cmd("GET")));
        assert_eq!(placement(&wait).ok(), Some(Placement::Everywhere));
        assert_eq!(fewest_acks(Value::Int(2), Value::Int(0)), Value::Int(0));
        assert_eq!(fewest_acks(Value::Int(1), Value::Int(3)), Value::Int(1));
        // Anything but a count (an error reply) wins, so the confirmation fails.
        assert_eq!(fewest_acks(Value::Int(1), Value::Nil), Value::Nil);
        assert_eq!(fewest_acks(Value::Nil, Value::Int(1)), Value::Nil);
    }

    #[test]
    fn a_single_slot_pipeline_is_one_group() {
        let placements = [route("{a}x"), route("{a}y")];
        assert_eq!(group_by_slot(&placements), vec![vec![0, 1]]);
    }

    #[test]
    fn placements_follow_the_command_keys() -> RedisResult<()> {
        let mut get = redis::cmd("GET");
        get.arg("{a}x");
        assert_eq!(placement(&get)?, route("{a}x"));
        assert_eq!(placement(&redis::cmd("PING"))?, Placement::Everywhere);
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg("return 1");
        assert_eq!(placement(&load)?, Placement::Everywhere);
        let mut script = redis::cmd("EVALSHA");
        script.arg("abc").arg(1).arg("{b}k").arg("v");
        assert_eq!(placement(&script)?, route("{b}k"));
        let mut same = redis::cmd("DEL");
        same.arg("{c}1").arg("{c}2");
        assert_eq!(placement(&same)?, route("{c}1"));
        let mut crossing = redis::cmd("DEL");
        crossing.arg("{c}1").arg("{d}2");
        assert!(placement(&crossing).is_err());
        Ok(())
    }
}
