//! Two arena shards as real processes against real Postgres and Redis: players fight, loot and
//! travel between them; one shard is killed with SIGKILL mid-play and restarted; the players log
//! back in. Nothing a reply acknowledged as durable is lost, and nothing is granted twice. Then
//! the release upgrade: a version-1 character is upgraded by a version-2 shard across a restart,
//! and a version-1 shard refuses it afterwards.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::TcpListener as PortProbe;
use std::process::Stdio;
use std::time::Duration;

use sqlx::migrate::MigrateDatabase;
use sqlx::{PgPool, Postgres};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

/// A port nothing listens on, never one handed out before in this process: the tests run side
/// by side, and a shard killed and restarted on its port leaves it free in between, where the
/// system could give it to another test's shard.
fn free_port() -> u16 {
    static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = PortProbe::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if HANDED_OUT.lock().unwrap().insert(port) {
            return port;
        }
    }
}

/// A scratch database and Redis namespace for one test, dropped at the end.
struct World {
    database_url: String,
    namespace: String,
    pool: PgPool,
}

impl World {
    async fn new() -> Self {
        let base = std::env::var("DATABASE_URL").expect("tests run with DATABASE_URL set");
        let run = format!("arena_{}", uuid::Uuid::new_v4().simple());
        let (server, _) = base.rsplit_once('/').unwrap();
        let database_url = format!("{server}/{run}");
        Postgres::create_database(&database_url).await.unwrap();
        let pool = PgPool::connect(&database_url).await.unwrap();
        Self {
            database_url,
            namespace: run,
            pool,
        }
    }

    async fn drop_all(self) {
        self.pool.close().await;
        let _ = Postgres::force_drop_database(&self.database_url).await;
        // Every master is swept (the test may run on a cluster).
        let keys = shardkeep::Keyspace::new(&self.namespace).unwrap();
        let backend = shardkeep::RedisBackend::connect(
            "REDIS_URL",
            &redis_url(),
            keys,
            shardkeep::backend::redis::RedisTimeouts::default(),
        )
        .await
        .unwrap();
        backend.purge_namespace().await;
    }
}

fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// One arena process.
struct Shard {
    name: &'static str,
    port: u16,
    child: Child,
    /// What it printed.
    said: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    /// The task reading what it prints, until its output ends.
    reader: Option<tokio::task::JoinHandle<()>>,
}

async fn start(
    world: &World,
    name: &'static str,
    port: u16,
    schema: u32,
    peers: &[(&str, u16)],
) -> Shard {
    start_with(world, name, port, schema, peers, (200, 1000)).await
}

/// [`start`] with the shard's cadences, `(checkpoint_ms, flush_ms)`.
async fn start_with(
    world: &World,
    name: &'static str,
    port: u16,
    schema: u32,
    peers: &[(&str, u16)],
    (checkpoint_ms, flush_ms): (u64, u64),
) -> Shard {
    let mut command = Command::new(env!("CARGO_BIN_EXE_arena"));
    command
        .arg("--shard")
        .arg(name)
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--namespace")
        .arg(&world.namespace)
        .arg("--schema-version")
        .arg(schema.to_string())
        .arg("--checkpoint-ms")
        .arg(checkpoint_ms.to_string())
        .arg("--flush-ms")
        .arg(flush_ms.to_string())
        .arg("--migrate")
        .env("DATABASE_URL", &world.database_url)
        .env("REDIS_URL", redis_url())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    for (peer, peer_port) in peers {
        command
            .arg("--peer")
            .arg(format!("{peer}=127.0.0.1:{peer_port}"));
    }
    let mut child = command.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let ready = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the shard starts")
        .unwrap()
        .unwrap_or_default();
    assert!(ready.contains("listening"), "{ready}");
    let said = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let heard = std::sync::Arc::clone(&said);
    let reader = tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            heard.lock().unwrap().push(line);
        }
    });
    Shard {
        name,
        port,
        child,
        said,
        reader: Some(reader),
    }
}

/// A player's connection.
struct Player {
    lines: tokio::io::Lines<BufReader<tokio::net::tcp::OwnedReadHalf>>,
    write: tokio::net::tcp::OwnedWriteHalf,
}

impl Player {
    async fn connect(port: u16) -> Self {
        let stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let (read, write) = stream.into_split();
        Self {
            lines: BufReader::new(read).lines(),
            write,
        }
    }

    async fn say(&mut self, line: &str) -> String {
        self.write
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(20), self.lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("no reply to {line:?}"))
            .unwrap()
            .unwrap_or_default()
    }

    async fn login(port: u16, name: &str) -> (Self, String) {
        let mut player = Self::connect(port).await;
        let reply = player.say(&format!("login {name}")).await;
        (player, reply)
    }
}

/// `key=value` from a reply.
fn field(reply: &str, key: &str) -> String {
    reply
        .split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in {reply:?}"))
        .to_owned()
}

fn bag_count(reply: &str, item: &str) -> u32 {
    field(reply, "bag")
        .split(',')
        .find_map(|e| e.strip_prefix(&format!("{item}:")))
        .map_or(0, |n| n.parse().unwrap())
}

/// Loots `item` `times` times; every reply must acknowledge a durable grant.
async fn loot(player: &mut Player, item: &str, times: u32) -> u32 {
    for _ in 0..times {
        let reply = player.say(&format!("loot {item}")).await;
        assert!(
            reply.starts_with("saved loot") || reply.starts_with("queued loot"),
            "{reply}"
        );
    }
    times
}

/// Loot jobs not applied yet (a handoff's activation record is a job too, and lands at once).
async fn jobs_pending(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM persistence_retry_jobs WHERE job_kind = 'arena_loot'")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// While `on`, every retry job stored gets its first attempt an hour out (as after a failed
/// attempt backing off): no worker applies it in the meantime.
async fn hold_new_jobs(pool: &PgPool, on: bool) {
    if on {
        sqlx::query(
            "CREATE FUNCTION arena_test_hold() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN NEW.next_attempt_at := now() + interval '1 hour'; RETURN NEW; END $$",
        )
        .execute(pool)
        .await
        .unwrap();
        sqlx::query(
            "CREATE TRIGGER arena_test_hold BEFORE INSERT ON persistence_retry_jobs
             FOR EACH ROW EXECUTE FUNCTION arena_test_hold()",
        )
        .execute(pool)
        .await
        .unwrap();
    } else {
        sqlx::query("DROP TRIGGER arena_test_hold ON persistence_retry_jobs")
            .execute(pool)
            .await
            .unwrap();
        sqlx::query("DROP FUNCTION arena_test_hold()")
            .execute(pool)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_shard_loses_nothing_acknowledged_and_doubles_nothing() {
    let world = World::new().await;
    let (port_a, port_b) = (free_port(), free_port());
    let mut a = start(&world, "a", port_a, 2, &[("b", port_b)]).await;
    let b = start(&world, "b", port_b, 2, &[("a", port_a)]).await;

    // Aria and Bram play on shard a; every loot reply is a durable acknowledgement.
    let (mut aria, reply) = Player::login(a.port, "Aria").await;
    assert!(reply.starts_with("ok Aria"), "{reply}");
    let (mut bram, _) = Player::login(a.port, "Bram").await;
    for _ in 0..3 {
        assert!(aria.say("fight").await.starts_with("ok fight"));
    }
    let mut aria_gems = loot(&mut aria, "gem", 3).await;
    let saved = aria.say("save").await;
    assert!(saved.starts_with("saved"), "{saved}");
    let aria_saved_xp: i64 = field(&saved, "xp").parse().unwrap();
    let mut bram_ores = loot(&mut bram, "ore", 2).await;

    // Another writer moves Bram's row behind the shard's back: his next loot cannot be saved
    // directly and goes down as a retry job (applied once, whatever dumps land around it). Its
    // first attempt is held back an hour (as after a failed attempt), so the job is still
    // queued when the shard dies: the next claim must land it, not supersede it.
    hold_new_jobs(&world.pool, true).await;
    sqlx::query("UPDATE characters SET state_version = state_version + 1 WHERE name = 'Bram'")
        .execute(&world.pool)
        .await
        .unwrap();
    let queued = bram.say("loot ore").await;
    assert!(queued.starts_with("queued loot"), "{queued}");
    bram_ores += 1;
    hold_new_jobs(&world.pool, false).await;

    // Cato travels from a to b and loots there.
    let (mut cato, _) = Player::login(a.port, "Cato").await;
    let mut cato_rubies = loot(&mut cato, "ruby", 1).await;
    let travel = cato.say("travel b").await;
    assert!(travel.starts_with("travel "), "{travel}");
    let token = travel.split_whitespace().nth(1).unwrap().to_owned();
    let mut cato = Player::connect(b.port).await;
    let arrived = cato.say(&format!("arrive {token}")).await;
    assert!(arrived.starts_with("ok arrived Cato"), "{arrived}");
    assert_eq!(bag_count(&arrived, "ruby"), 1, "{arrived}");
    cato_rubies += loot(&mut cato, "ruby", 2).await;

    // More play on a, then a dies without warning, Bram's loot job still queued.
    aria_gems += loot(&mut aria, "gem", 2).await;
    assert!(aria.say("fight").await.starts_with("ok fight"));
    assert_eq!(jobs_pending(&world.pool).await, 1, "Bram's loot is queued");
    a.child.start_kill().unwrap();
    a.child.wait().await.unwrap();
    drop((aria, bram));

    let mut a = start(&world, "a", port_a, 2, &[("b", port_b)]).await;
    let (mut aria, reply) = Player::login(a.port, "Aria").await;
    assert!(reply.starts_with("ok Aria"), "{reply}");
    assert_eq!(bag_count(&reply, "gem"), aria_gems, "{reply}");
    assert_eq!(
        field(&reply, "money"),
        (5 * aria_gems).to_string(),
        "{reply}"
    );
    let xp: i64 = field(&reply, "xp").parse().unwrap();
    assert!(
        xp >= aria_saved_xp,
        "saved xp {aria_saved_xp} lost: {reply}"
    );
    let (mut bram, reply) = Player::login(a.port, "Bram").await;
    assert_eq!(bag_count(&reply, "ore"), bram_ores, "{reply}");
    assert_eq!(
        jobs_pending(&world.pool).await,
        0,
        "settled by Bram's claim"
    );
    assert_eq!(
        field(&reply, "money"),
        (5 * bram_ores).to_string(),
        "{reply}"
    );

    // Everyone quits (Aria with one more fight, saved by her logout); the rows hold exactly
    // what was acknowledged.
    assert!(aria.say("fight").await.starts_with("ok fight"));
    for player in [&mut aria, &mut bram, &mut cato] {
        let bye = player.say("quit").await;
        assert!(bye.starts_with("bye"), "{bye}");
    }
    let rows: Vec<(String, serde_json::Value, i32)> =
        sqlx::query_as("SELECT name, state, schema_version FROM characters ORDER BY name")
            .fetch_all(&world.pool)
            .await
            .unwrap();
    let expect = [
        ("Aria", "gem", aria_gems),
        ("Bram", "ore", bram_ores),
        ("Cato", "ruby", cato_rubies),
    ];
    // Exact counts in the rows: a grant lost or applied twice (a job over a dump that holds it)
    // shows here.
    assert_eq!(rows.len(), expect.len());
    for ((name, state, schema), (want_name, item, count)) in rows.iter().zip(expect) {
        assert_eq!(name, want_name);
        assert_eq!(*schema, 2);
        assert_eq!(state["bag"][item], count, "{name}: {state}");
        assert_eq!(state["coins"], 5 * i64::from(count), "{name}: {state}");
    }
    let created: i64 =
        sqlx::query_scalar("SELECT count(*) FROM character_audit WHERE event_kind = 'created'")
            .fetch_one(&world.pool)
            .await
            .unwrap();
    assert_eq!(created, 3, "one audit row per created fighter");

    // A graceful stop with a player online: her logout save lands and her closed stream is
    // journaled for cleanup, as for a dropped connection.
    let (mut aria, _) = Player::login(a.port, "Aria").await;
    let fought = aria.say("fight").await;
    let xp: i64 = field(&fought, "xp").parse().unwrap();
    stop(&mut a).await;
    let said = a.said.lock().unwrap().clone();
    assert!(
        said.iter()
            .any(|l| l == "arena: journaled 1 closed streams at shutdown"),
        "{said:?}"
    );
    let stored: i64 =
        sqlx::query_scalar("SELECT (state->>'xp')::int8 FROM characters WHERE name = 'Aria'")
            .fetch_one(&world.pool)
            .await
            .unwrap();
    assert_eq!(stored, xp, "the shutdown's final save landed");
    let mut b = b;
    stop(&mut b).await;
    world.drop_all().await;
}

async fn kill(shard: &mut Shard) {
    shard.child.start_kill().unwrap();
    shard.child.wait().await.unwrap();
}

/// Two crashes in a row and a zombie: a shard dies with a fighter's progress in its checkpoint
/// only (flushes are a minute apart), its replacement loads that progress and dies before
/// writing anything, and the next replacement must still load it — not the older row. Then the
/// same fighter logs in on another shard while the first copy plays on: the zombie's loot is
/// refused and the copy evicted, and only what the live copy acknowledged is in the row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_double_crash_and_a_zombie_lose_nothing_checkpointed_or_acknowledged() {
    let world = World::new().await;
    let (port_a, port_b) = (free_port(), free_port());
    let slow_flushes = (200, 60_000);
    let mut a = start_with(&world, "a", port_a, 2, &[], slow_flushes).await;
    let (mut dara, reply) = Player::login(a.port, "Dara").await;
    assert!(reply.starts_with("ok Dara"), "{reply}");
    let gems = loot(&mut dara, "gem", 1).await;
    // A few checkpoint periods: the fights are in Redis, not in the row. The copy's one flush a
    // minute can fall inside that window (its place in the period comes from its id); then a
    // second round of fights is what the row lags.
    let (mut xp, mut row_xp) = (0_i64, 0_i64);
    for _round in 0..2 {
        for _ in 0..5 {
            xp = field(&dara.say("fight").await, "xp").parse().unwrap();
        }
        tokio::time::sleep(Duration::from_millis(800)).await;
        row_xp =
            sqlx::query_scalar("SELECT (state->>'xp')::int8 FROM characters WHERE name = 'Dara'")
                .fetch_one(&world.pool)
                .await
                .unwrap();
        if row_xp < xp {
            break;
        }
    }
    assert!(row_xp < xp, "the row lags the checkpoint ({row_xp})");
    kill(&mut a).await;
    drop(dara);

    // The replacement loads the checkpointed fights and dies before its first write (its
    // cadences are far apart).
    let mut a = start_with(&world, "a", port_a, 2, &[], (60_000, 120_000)).await;
    let (dara, reply) = Player::login(a.port, "Dara").await;
    assert_eq!(field(&reply, "xp"), xp.to_string(), "{reply}");
    kill(&mut a).await;
    drop(dara);

    // Its replacement loads what it loaded, not the older row.
    let a = start_with(&world, "a", port_a, 2, &[("b", port_b)], slow_flushes).await;
    let b = start(&world, "b", port_b, 2, &[("a", port_a)]).await;
    let (mut zombie, reply) = Player::login(a.port, "Dara").await;
    assert_eq!(
        field(&reply, "xp"),
        xp.to_string(),
        "after two crashes: {reply}"
    );
    assert_eq!(bag_count(&reply, "gem"), gems, "{reply}");

    // Dara logs in on b while a's copy plays on: a's copy is a zombie now.
    let (mut live, reply) = Player::login(b.port, "Dara").await;
    assert_eq!(field(&reply, "xp"), xp.to_string(), "{reply}");
    let refused = zombie.say("loot gem").await;
    assert!(
        refused.starts_with("error this copy was replaced"),
        "the zombie's loot is not acknowledged: {refused}"
    );
    let live_gems = gems + loot(&mut live, "gem", 2).await;
    assert!(live.say("fight").await.starts_with("ok fight"));
    let bye = live.say("quit").await;
    assert_eq!(bye, "bye saved");
    let (state, epoch): (serde_json::Value, i64) =
        sqlx::query_as("SELECT state, owner_epoch FROM characters WHERE name = 'Dara'")
            .fetch_one(&world.pool)
            .await
            .unwrap();
    assert_eq!(state["bag"]["gem"], live_gems, "{state}");
    assert_eq!(state["coins"], 5 * i64::from(live_gems), "{state}");
    assert_eq!(state["xp"], xp + 10, "{state}");
    // The zombie's connection was closed with its refusal, and it claimed nothing since.
    let closed = tokio::time::timeout(Duration::from_secs(5), zombie.lines.next_line())
        .await
        .unwrap()
        .unwrap_or_default();
    assert_eq!(closed, None, "the zombie's connection is closed");
    let now: i64 = sqlx::query_scalar("SELECT owner_epoch FROM characters WHERE name = 'Dara'")
        .fetch_one(&world.pool)
        .await
        .unwrap();
    assert_eq!(now, epoch, "the zombie minted nothing");
    let (mut a, mut b) = (a, b);
    stop(&mut a).await;
    stop(&mut b).await;
    world.drop_all().await;
}

/// SIGTERM, then the process's own graceful stop.
async fn stop(shard: &mut Shard) {
    if let Some(pid) = shard.child.id() {
        let _ = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status();
    }
    let status = tokio::time::timeout(Duration::from_secs(30), shard.child.wait())
        .await
        .unwrap_or_else(|_| panic!("shard {} did not stop", shard.name))
        .unwrap();
    assert!(
        status.success(),
        "shard {} exited with {status}",
        shard.name
    );
    // What it printed last is read before anyone looks at it: the process can be gone while
    // its last lines still wait in the pipe.
    if let Some(reader) = shard.reader.take() {
        tokio::time::timeout(Duration::from_secs(10), reader)
            .await
            .expect("the shard's output ends with it")
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_two_shard_upgrades_a_character_that_version_one_then_refuses() {
    let world = World::new().await;
    let port = free_port();
    let mut old = start(&world, "a", port, 1, &[]).await;
    let (mut dara, reply) = Player::login(port, "Dara").await;
    assert!(
        reply.contains("title=-"),
        "version 1 has no titles: {reply}"
    );
    loot(&mut dara, "gem", 2).await;
    assert!(dara.say("quit").await.starts_with("bye"));
    stop(&mut old).await;
    let (schema, gold): (i32, i64) = sqlx::query_as(
        "SELECT schema_version, (state->>'gold')::int8 FROM characters WHERE name = 'Dara'",
    )
    .fetch_one(&world.pool)
    .await
    .unwrap();
    assert_eq!((schema, gold), (1, 10));

    // The new release: loaded, upgraded, saved back as version 2.
    let mut new = start(&world, "a", port, 2, &[]).await;
    let (mut dara, reply) = Player::login(port, "Dara").await;
    assert!(
        reply.contains("money=10") && reply.contains("title=novice"),
        "{reply}"
    );
    assert!(dara.say("quit").await.starts_with("bye"));
    stop(&mut new).await;
    let (schema, coins): (i32, i64) = sqlx::query_as(
        "SELECT schema_version, (state->>'coins')::int8 FROM characters WHERE name = 'Dara'",
    )
    .fetch_one(&world.pool)
    .await
    .unwrap();
    assert_eq!((schema, coins), (2, 10));

    // An old process still running somewhere refuses her, and claims nothing.
    let epoch: i64 = sqlx::query_scalar("SELECT owner_epoch FROM characters WHERE name = 'Dara'")
        .fetch_one(&world.pool)
        .await
        .unwrap();
    let mut old = start(&world, "a", port, 1, &[]).await;
    let (_, reply) = Player::login(port, "Dara").await;
    assert!(
        reply.starts_with("error") && reply.contains("schema version 2"),
        "{reply}"
    );
    let after: i64 = sqlx::query_scalar("SELECT owner_epoch FROM characters WHERE name = 'Dara'")
        .fetch_one(&world.pool)
        .await
        .unwrap();
    assert_eq!(after, epoch, "no epoch was minted");
    stop(&mut old).await;
    world.drop_all().await;
}
