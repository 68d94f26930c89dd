//! `shardkeep migrate`: apply the embedded migrations.

use std::process::ExitCode;

use anyhow::Context;

use shardkeep::PostgresBackend;

use crate::cli::MigrateArgs;

/// Applies every pending migration and prints what it applied.
pub(crate) async fn run(args: &MigrateArgs) -> anyhow::Result<ExitCode> {
    let url = super::database_url(&args.postgres)?;
    if shardkeep::backend::sqlite::is_sqlite_url(url) {
        super::refuse_mixed_stores()?;
        // The embedded store: the file is created when missing.
        let db = shardkeep::SqliteBackend::connect("DATABASE_URL", url).await?;
        let applied = db.migrate().await.context("applying migrations")?;
        report(&applied);
        db.close().await;
        return Ok(ExitCode::SUCCESS);
    }
    if args.create_database {
        let url = super::database_url(&args.postgres)?;
        if PostgresBackend::create_database_if_missing("DATABASE_URL", url).await? {
            println!("migrations: created the database named in DATABASE_URL");
        }
    }
    let pg = super::connect_postgres(&args.postgres, 1).await?;
    let applied = pg.migrate().await.context("applying migrations")?;
    report(&applied);
    pg.close().await;
    Ok(ExitCode::SUCCESS)
}

fn report(applied: &[shardkeep::backend::postgres::AppliedMigration]) {
    if applied.is_empty() {
        println!("migrations: database is up to date");
    }
    for m in applied {
        println!("migrations: applied {:04} {}", m.version, m.description);
    }
}
