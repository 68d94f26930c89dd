//! Fuzzed checkpoint hashes, planted in real Redis the way corruption or an older or newer
//! process would leave them: fields missing, of any value (`inf`, `1e300`, hex, garbage), a
//! snapshot of another character, mangled or arbitrary bytes, or a key of another type. The
//! reader answers a typed error or a snapshot consistent with its key and guard; a login still
//! loads from the row; a guarded write either lands whole or leaves the hash exactly as it was.

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use serde_json::Value;
use shardkeep::character::{
    CharacterLoader, CharacterSnapshot, CharacterStore, CheckpointError, CheckpointStore,
    CheckpointWrite, LoadError,
};
use shardkeep_testkit::TestRedis;
use sqlx::PgPool;

use super::fuzz_decoders::{Mutation, any_json, apply, edits, mangle, mutation};

/// Cases (the closing note of the fuzzing issue counts them).
const CASES: usize = 384;

/// A number field as a corrupted or foreign writer could leave it.
fn number_field() -> impl Strategy<Value = Option<String>> {
    prop::option::of(prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        (0i64..50).prop_map(|n| n.to_string()),
        (1_000_000_000_000_000i64..i64::MAX).prop_map(|n| n.to_string()),
        Just(i64::MIN.to_string()),
        Just("9223372036854775808".to_owned()),
        Just("007".to_owned()),
        Just("-0".to_owned()),
        Just("inf".to_owned()),
        Just("-inf".to_owned()),
        Just("nan".to_owned()),
        Just("1e300".to_owned()),
        Just("0x10".to_owned()),
        Just(" 7 ".to_owned()),
        ".{0,12}",
    ])
}

/// What the `snapshot` field holds.
#[derive(Debug, Clone)]
enum Body {
    /// The character's own snapshot with structure-aware changes.
    Mutated(Vec<Mutation>),
    /// Its encoding with bytes flipped, cut or inserted.
    Mangled(Vec<(usize, u8, u8)>),
    /// Another character's snapshot.
    Foreign,
    /// Anything.
    Bytes(Vec<u8>),
}

fn body() -> impl Strategy<Value = Option<Body>> {
    prop::option::of(prop_oneof![
        prop::collection::vec(mutation(), 0..3).prop_map(Body::Mutated),
        edits().prop_map(Body::Mangled),
        Just(Body::Foreign),
        prop::collection::vec(any::<u8>(), 0..128).prop_map(Body::Bytes),
    ])
}

/// One planted key.
#[derive(Debug, Clone)]
enum Planted {
    Hash {
        epoch: Option<String>,
        schema: Option<String>,
        snapshot: Option<Body>,
        extra: Option<(String, Value)>,
    },
    /// The character's own checkpoint, as a writer stores it.
    Sound,
    /// A key of another type where the hash belongs.
    String(Vec<u8>),
    List,
}

fn planted() -> impl Strategy<Value = Planted> {
    prop_oneof![
        8 => (number_field(), number_field(), body(), prop::option::of(("[a-z]{1,8}", any_json())))
            .prop_map(|(epoch, schema, snapshot, extra)| Planted::Hash { epoch, schema, snapshot, extra }),
        2 => Just(Planted::Sound),
        1 => prop::collection::vec(any::<u8>(), 0..32).prop_map(Planted::String),
        1 => Just(Planted::List),
    ]
}

fn encode(body: &Body, own: &CharacterSnapshot, foreign: &CharacterSnapshot) -> Vec<u8> {
    match body {
        Body::Mutated(changes) => {
            let mut doc = serde_json::to_value(own).unwrap();
            for change in changes {
                apply(&mut doc, change);
            }
            serde_json::to_vec(&doc).unwrap()
        }
        Body::Mangled(edits) => mangle(serde_json::to_vec(own).unwrap(), edits),
        Body::Foreign => serde_json::to_vec(foreign).unwrap(),
        Body::Bytes(bytes) => bytes.clone(),
    }
}

/// An i64 in the canonical text every writer stores, else `None` (what the guard compares).
fn canonical(text: &str) -> Option<i64> {
    let value: i64 = text.parse().ok()?;
    (value.to_string() == text).then_some(value)
}

/// What the fence must answer a writer at `epoch` with `schema` over `plant`: a readable
/// stored epoch above the writer's refuses; an unreadable one marks the hash corrupt, so it is
/// replaced; then a readable stored schema above the writer's refuses, an unreadable one is
/// replaced.
fn expected_write(plant: &Planted, epoch: i64, schema: u32) -> CheckpointWrite {
    let Planted::Hash {
        epoch: stored_epoch,
        schema: stored_schema,
        ..
    } = plant
    else {
        return CheckpointWrite::Written;
    };
    match stored_epoch.as_deref().map(canonical) {
        Some(Some(stored)) if stored > epoch => {
            return CheckpointWrite::NotOwner {
                stored_epoch: stored,
            };
        }
        Some(None) => return CheckpointWrite::Written,
        _ => {}
    }
    match stored_schema.as_deref().map(canonical) {
        Some(Some(stored)) if stored > i64::from(schema) => CheckpointWrite::SchemaNewer {
            stored_schema: u32::try_from(stored).unwrap_or(u32::MAX),
        },
        _ => CheckpointWrite::Written,
    }
}

/// What `key` holds, to compare before and after a call: a hash as its fields and values in
/// field order (a hash table's `DUMP` follows its internal order, which an incremental rehash
/// moves on any lookup), any other value as its `DUMP`.
async fn dump(conn: &mut shardkeep::backend::redis::RedisConn, key: &str) -> Option<Vec<u8>> {
    let kind: String = redis::cmd("TYPE").arg(key).query_async(conn).await.unwrap();
    if kind != "hash" {
        return redis::cmd("DUMP").arg(key).query_async(conn).await.unwrap();
    }
    let mut fields: Vec<(Vec<u8>, Vec<u8>)> = redis::cmd("HGETALL")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap();
    fields.sort();
    let mut out = b"hash".to_vec();
    for (field, value) in fields {
        for part in [field, value] {
            out.extend_from_slice(&part.len().to_le_bytes());
            out.extend_from_slice(&part);
        }
    }
    Some(out)
}

/// A login over whatever checkpoint is planted: the row is sound, so it loads (or refuses
/// content of a newer schema than this process plays, by name). Returns the new owner's epoch.
async fn login_over_it(
    loader: &CharacterLoader,
    store: &CharacterStore,
    id: uuid::Uuid,
    what: &str,
) -> i64 {
    match loader.claim_and_load(id, 0).await {
        Ok(loaded) => {
            assert_eq!(loaded.snapshot.character_id, id, "{what}");
            loaded.snapshot.owner_epoch
        }
        Err(LoadError::Schema { character_id, .. }) => {
            assert_eq!(character_id, id, "{what}");
            store.load(id).await.unwrap().unwrap().owner_epoch
        }
        Err(other) => panic!("{what}: the login failed: {other}"),
    }
}

/// The character store, a loader reading `checkpoints`, the character whose checkpoint is
/// fuzzed and another one (whose snapshot is foreign under the first one's key).
async fn fuzzed_pair(
    pool: &PgPool,
    checkpoints: &CheckpointStore,
) -> (
    CharacterStore,
    CharacterLoader,
    CharacterSnapshot,
    CharacterSnapshot,
) {
    let store = CharacterStore::new(shardkeep_testkit::pg(pool));
    let loader = CharacterLoader::new(
        store.clone(),
        Some(checkpoints.clone()),
        shardkeep_testkit::model::LedgerModel::handle(),
        std::time::Duration::from_secs(5),
    );
    let own = shardkeep_testkit::fixtures::created(&store, "Fuzzed").await;
    let foreign = shardkeep_testkit::fixtures::created(&store, "Other").await;
    (store, loader, own, foreign)
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn fuzzed_checkpoint_hashes_are_read_typed_skipped_at_login_and_never_half_overwritten(
    pool: PgPool,
) {
    let redis = TestRedis::new().await;
    let checkpoints = CheckpointStore::new(redis.backend());
    let (store, loader, own, foreign) = fuzzed_pair(&pool, &checkpoints).await;
    let id = own.character_id;
    let key = redis.keys().checkpoint(id);
    let mut conn = redis.raw().await;
    let mut runner = TestRunner::new(Config {
        cases: CASES as u32,
        ..Config::default()
    });
    let strategy = planted();
    let (mut read_ok, mut read_refused, mut written, mut refused_writes) = (0, 0, 0, 0);
    for case in 0..CASES {
        let plant = strategy.new_tree(&mut runner).unwrap().current();
        let _: () = redis::cmd("DEL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        match &plant {
            Planted::Hash {
                epoch,
                schema,
                snapshot,
                extra,
            } => {
                let mut fields: Vec<(String, Vec<u8>)> = Vec::new();
                if let Some(epoch) = epoch {
                    fields.push(("epoch".into(), epoch.clone().into_bytes()));
                }
                if let Some(schema) = schema {
                    fields.push(("schema".into(), schema.clone().into_bytes()));
                }
                if let Some(body) = snapshot {
                    fields.push(("snapshot".into(), encode(body, &own, &foreign)));
                }
                if let Some((name, value)) = extra {
                    fields.push((format!("x-{name}"), serde_json::to_vec(value).unwrap()));
                }
                if fields.is_empty() {
                    fields.push(("x".into(), b"1".to_vec()));
                }
                let mut hset = redis::cmd("HSET");
                hset.arg(&key);
                for (name, value) in &fields {
                    hset.arg(name).arg(value);
                }
                let _: i64 = hset.query_async(&mut conn).await.unwrap();
            }
            Planted::Sound => {
                let _: i64 = redis::cmd("HSET")
                    .arg(&key)
                    .arg("epoch")
                    .arg(own.owner_epoch)
                    .arg("schema")
                    .arg(own.schema_version)
                    .arg("snapshot")
                    .arg(serde_json::to_vec(&own).unwrap())
                    .query_async(&mut conn)
                    .await
                    .unwrap();
            }
            Planted::String(bytes) => {
                let _: () = redis::cmd("SET")
                    .arg(&key)
                    .arg(bytes)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
            }
            Planted::List => {
                let _: i64 = redis::cmd("RPUSH")
                    .arg(&key)
                    .arg("a")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
            }
        }
        let what = format!("case {case}: {plant:?}");
        match checkpoints.read_held(id).await {
            Ok(Some(held)) => {
                read_ok += 1;
                let snapshot = held.snapshot;
                assert_eq!(snapshot.character_id, id, "{what}");
                // The guard never trails the content it guards.
                assert!(held.held_by >= snapshot.owner_epoch, "{what}");
                match &plant {
                    Planted::Hash {
                        epoch: Some(epoch), ..
                    } => {
                        let epoch = epoch.parse::<i64>().ok();
                        assert_eq!(epoch, Some(held.held_by), "{what}");
                    }
                    Planted::Sound => assert_eq!(snapshot, own, "{what}"),
                    _ => panic!("{what}: a snapshot read without a guard epoch"),
                }
            }
            Ok(None) => {}
            Err(CheckpointError::Corrupt { character_id, .. }) => {
                read_refused += 1;
                assert_eq!(character_id, id, "{what}");
            }
            Err(other) => panic!("{what}: not a typed corruption: {other}"),
        }
        let epoch = login_over_it(&loader, &store, id, &what).await;
        // The new owner checkpoints: it lands whole, or the planted key stays as it was.
        let before = dump(&mut conn, &key).await;
        let mine = CharacterSnapshot {
            owner_epoch: epoch,
            ..own.clone()
        };
        let outcome = checkpoints.write(&mine).await;
        let expected = expected_write(&plant, epoch, mine.schema_version);
        match outcome {
            Ok(CheckpointWrite::Written) => {
                written += 1;
                assert_eq!(expected, CheckpointWrite::Written, "{what}");
                let back = checkpoints.read(id).await.unwrap().unwrap();
                assert_eq!(back.owner_epoch, epoch, "{what}");
                assert_eq!(back.state, mine.state, "{what}");
            }
            Ok(
                refusal @ (CheckpointWrite::NotOwner { .. } | CheckpointWrite::SchemaNewer { .. }),
            ) => {
                refused_writes += 1;
                assert_eq!(refusal, expected, "{what}");
                assert_eq!(
                    dump(&mut conn, &key).await,
                    before,
                    "{what}: a refused write changed the key"
                );
            }
            Err(other) => panic!("{what}: the write failed: {other}"),
        }
    }
    println!(
        "checkpoint fuzz: {CASES} cases, reads {read_ok} ok / {read_refused} corrupt, writes {written} landed / {refused_writes} refused"
    );
    assert!(read_ok > 0 && read_refused > 0 && written > 0 && refused_writes > 0);
}

/// A value of any storage class, as a hand edit or another writer could leave in a column of
/// the embedded store's `checkpoints` table (its INTEGER affinity turns integer-looking text
/// and whole reals into integers and keeps the rest as written).
#[derive(Debug, Clone)]
enum Stored {
    Int(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

impl Stored {
    /// Binds the value with its own storage class.
    fn bind<'q>(
        &self,
        query: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments>,
    ) -> sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments> {
        match self {
            Self::Int(n) => query.bind(*n),
            Self::Real(x) => query.bind(*x),
            Self::Text(text) => query.bind(text.clone()),
            Self::Blob(bytes) => query.bind(bytes.clone()),
        }
    }

    /// Bytes as text when they are UTF-8 (and not asked to be a blob), else as a blob.
    fn of_bytes(bytes: Vec<u8>, as_blob: bool) -> Self {
        match String::from_utf8(bytes) {
            Ok(text) if !as_blob => Self::Text(text),
            Ok(text) => Self::Blob(text.into_bytes()),
            Err(err) => Self::Blob(err.into_bytes()),
        }
    }
}

fn stored_number() -> impl Strategy<Value = Stored> {
    prop_oneof![
        3 => (0i64..50).prop_map(Stored::Int),
        1 => any::<i64>().prop_map(Stored::Int),
        1 => prop_oneof![Just(5.5f64), Just(8.0), Just(-1e300), Just(0.25)].prop_map(Stored::Real),
        2 => number_field().prop_map(|text| Stored::Text(text.unwrap_or_default())),
        1 => prop::collection::vec(any::<u8>(), 0..8).prop_map(Stored::Blob),
    ]
}

#[derive(Debug, Clone)]
struct PlantedRow {
    /// The character's own checkpoint as a writer stores it (the other fields are ignored).
    sound: bool,
    epoch: Stored,
    schema: Stored,
    snapshot: Option<Body>,
    snapshot_as_blob: bool,
}

fn planted_row() -> impl Strategy<Value = PlantedRow> {
    (
        prop::bool::weighted(0.2),
        stored_number(),
        stored_number(),
        body(),
        any::<bool>(),
    )
        .prop_map(
            |(sound, epoch, schema, snapshot, snapshot_as_blob)| PlantedRow {
                sound,
                epoch,
                schema,
                snapshot,
                snapshot_as_blob,
            },
        )
}

/// The row as stored, to tell a refused write left it exactly as it was.
async fn row_text(db: &shardkeep::SqliteBackend, id: uuid::Uuid) -> Option<String> {
    sqlx::query_scalar(
        "SELECT quote(owner_epoch) || '|' || quote(schema) || '|' || quote(snapshot) || '|' ||
                quote(expires_at)
           FROM checkpoints WHERE character_id = ?1",
    )
    .bind(id)
    .fetch_optional(db.pool())
    .await
    .unwrap()
}

/// The embedded driver under the same fuzzing: rows of any storage class in every column. The
/// reader answers a typed error or a snapshot consistent with its row; a login still loads; a
/// write lands whole exactly when the guard (an integer epoch above the writer's refuses, then an
/// integer schema above the writer's) lets it, and a refused one leaves the row as it was.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn fuzzed_embedded_checkpoint_rows_are_read_typed_and_never_half_overwritten(pool: PgPool) {
    let sqlite = shardkeep_testkit::TestSqlite::new().await;
    let db = sqlite.backend();
    let checkpoints = CheckpointStore::embedded(db.clone());
    let (store, loader, own, foreign) = fuzzed_pair(&pool, &checkpoints).await;
    let id = own.character_id;
    let far = chrono::Utc::now().timestamp_micros() + 3_600_000_000;
    let mut runner = TestRunner::new(Config {
        cases: CASES as u32,
        ..Config::default()
    });
    let strategy = planted_row();
    let (mut read_ok, mut read_refused, mut written, mut refused_writes) = (0, 0, 0, 0);
    for case in 0..CASES {
        let mut plant = strategy.new_tree(&mut runner).unwrap().current();
        if plant.sound {
            let row = store.load(id).await.unwrap().unwrap();
            plant.epoch = Stored::Int(row.owner_epoch);
            plant.schema = Stored::Int(i64::from(row.schema_version));
            plant.snapshot = None;
            plant.snapshot_as_blob = false;
        }
        sqlx::query("DELETE FROM checkpoints")
            .execute(db.pool())
            .await
            .unwrap();
        let body = match &plant.snapshot {
            Some(body) => Stored::of_bytes(encode(body, &own, &foreign), plant.snapshot_as_blob),
            None => {
                let row = store.load(id).await.unwrap().unwrap();
                Stored::of_bytes(serde_json::to_vec(&row).unwrap(), plant.snapshot_as_blob)
            }
        };
        let insert = sqlx::query(
            "INSERT INTO checkpoints (character_id, owner_epoch, schema, snapshot, expires_at)
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .bind(id);
        let insert = body.bind(plant.schema.bind(plant.epoch.bind(insert)));
        insert.bind(far).execute(db.pool()).await.unwrap();
        // What the columns hold once affinity has had its say.
        let (epoch, schema): (Option<i64>, Option<i64>) = sqlx::query_as(
            "SELECT CASE WHEN typeof(owner_epoch) = 'integer' THEN owner_epoch END,
                    CASE WHEN typeof(schema) = 'integer' THEN schema END
               FROM checkpoints WHERE character_id = ?1",
        )
        .bind(id)
        .fetch_one(db.pool())
        .await
        .unwrap();
        let what = format!("case {case}: {plant:?} (stored epoch {epoch:?}, schema {schema:?})");
        match checkpoints.read_held(id).await {
            Ok(Some(held)) => {
                read_ok += 1;
                assert_eq!(held.snapshot.character_id, id, "{what}");
                assert_eq!(Some(held.held_by), epoch, "{what}");
                assert!(held.held_by >= held.snapshot.owner_epoch, "{what}");
            }
            Ok(None) => panic!("{what}: a live row read as absent"),
            Err(CheckpointError::Corrupt { character_id, .. }) => {
                read_refused += 1;
                assert_eq!(character_id, id, "{what}");
            }
            Err(other) => panic!("{what}: not a typed corruption: {other}"),
        }
        let epoch_now = login_over_it(&loader, &store, id, &what).await;
        let before = row_text(&db, id).await;
        let mine = CharacterSnapshot {
            owner_epoch: epoch_now,
            ..own.clone()
        };
        let expected = match (epoch, schema) {
            (Some(stored), _) if stored > epoch_now => CheckpointWrite::NotOwner {
                stored_epoch: stored,
            },
            (None, _) => CheckpointWrite::Written,
            (Some(_), Some(stored)) if stored > i64::from(mine.schema_version) => {
                CheckpointWrite::SchemaNewer {
                    stored_schema: u32::try_from(stored).unwrap_or(u32::MAX),
                }
            }
            _ => CheckpointWrite::Written,
        };
        match checkpoints.write(&mine).await {
            Ok(CheckpointWrite::Written) => {
                written += 1;
                assert_eq!(expected, CheckpointWrite::Written, "{what}");
                let back = checkpoints.read(id).await.unwrap().unwrap();
                assert_eq!(back.owner_epoch, epoch_now, "{what}");
                assert_eq!(back.state, mine.state, "{what}");
            }
            Ok(refusal) => {
                refused_writes += 1;
                assert_eq!(refusal, expected, "{what}");
                assert_eq!(
                    row_text(&db, id).await,
                    before,
                    "{what}: a refused write changed the row"
                );
            }
            Err(other) => panic!("{what}: the write failed: {other}"),
        }
    }
    println!(
        "embedded checkpoint fuzz: {CASES} cases, reads {read_ok} ok / {read_refused} corrupt, writes {written} landed / {refused_writes} refused"
    );
    assert!(read_ok > 0 && read_refused > 0 && written > 0 && refused_writes > 0);
}
