//! Postgres through PgBouncer in transaction pooling mode. `scripts/test` starts a private
//! PgBouncer and names it in `SHARDKEEP_TEST_PGBOUNCER_URL` for every pass; its PgBouncer pass
//! also sets `SHARDKEEP_TEST_PG_POOLER=transaction`, and then every store a test builds with
//! [`pg`] reaches Postgres through PgBouncer.

use std::time::Duration;

use shardkeep::PostgresBackend;
use shardkeep::backend::postgres::PgPooler;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// Names the suite's PgBouncer (a `postgres://` URL; its database part is ignored).
pub const PGBOUNCER_URL_VAR: &str = "SHARDKEEP_TEST_PGBOUNCER_URL";

/// `transaction` in the pass where every store reaches Postgres through PgBouncer.
pub const POOLER_VAR: &str = "SHARDKEEP_TEST_PG_POOLER";

/// The pooler the stores of this pass go through.
pub fn pass_pooler() -> PgPooler {
    std::env::var(POOLER_VAR)
        .ok()
        .and_then(|raw| raw.parse().ok())
        .unwrap_or_default()
}

/// The suite's PgBouncer URL, for `database`.
pub fn pgbouncer_url(database: &str) -> String {
    let url = std::env::var(PGBOUNCER_URL_VAR).unwrap_or_else(|_| {
        panic!("tests run with {PGBOUNCER_URL_VAR} set to a PgBouncer in transaction mode (scripts/test starts one)")
    });
    let (server, _) = url.rsplit_once('/').unwrap_or((&url, ""));
    format!("{server}/{database}")
}

/// The database `pool` is connected to.
pub fn database_of(pool: &PgPool) -> String {
    pool.connect_options()
        .get_database()
        .unwrap_or("postgres")
        .to_owned()
}

/// Connect options for `pool`'s database through the suite's PgBouncer, adjusted for `pooler`.
pub fn bouncer_options(pool: &PgPool, pooler: PgPooler) -> PgConnectOptions {
    let url = pgbouncer_url(&database_of(pool));
    let options: PgConnectOptions = url.parse().expect("the PgBouncer URL parses");
    PostgresBackend::options_for(options, pooler)
}

/// The backend a test's stores use over `pool`'s database: `pool` itself, or in the PgBouncer
/// pass a pool of the same database through PgBouncer with shardkeep's transaction-mode
/// settings (connecting on first use).
pub fn pg(pool: &PgPool) -> PostgresBackend {
    match pass_pooler() {
        PgPooler::None => PostgresBackend::from_pool(pool.clone()),
        pooler => {
            let bounced = PgPoolOptions::new()
                .max_connections(pool.options().get_max_connections().max(2))
                .acquire_timeout(Duration::from_secs(10))
                .connect_lazy_with(bouncer_options(pool, pooler));
            PostgresBackend::from_pool_through(bounced, pooler)
        }
    }
}

/// The URL of `database` for a `shardkeep` process of this pass: on `DATABASE_URL`'s server, or
/// through PgBouncer in the PgBouncer pass (give the process [`pass_pooler`] as
/// `SHARDKEEP_PG_POOLER` with it).
pub fn pass_database_url(database: &str) -> String {
    match pass_pooler() {
        PgPooler::None => {
            let direct = std::env::var("DATABASE_URL").expect("tests run with DATABASE_URL set");
            let (server, _) = direct.rsplit_once('/').unwrap_or((&direct, ""));
            format!("{server}/{database}")
        }
        _ => pgbouncer_url(database),
    }
}

/// Ends every other session on `pool`'s database — the server connections PgBouncer keeps to it
/// after its clients left — so sqlx can drop the test's database when the test ends (a database
/// with sessions on it cannot be dropped). `pool` must reach Postgres directly.
pub async fn release_pooler_connections(pool: &PgPool) {
    let _ = sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .execute(pool)
    .await;
}
