//! `shardkeep migrate`: apply the embedded migrations.

use std::process::ExitCode;

use anyhow::Context;

use crate::cli::PostgresArgs;

/// Applies every pending migration and prints what it applied.
pub(crate) async fn run(args: &PostgresArgs) -> anyhow::Result<ExitCode> {
    let pg = super::connect_postgres(args, 1).await?;
    let applied = pg.migrate().await.context("applying migrations")?;
    if applied.is_empty() {
        println!("migrations: database is up to date");
    }
    for m in &applied {
        println!("migrations: applied {:04} {}", m.version, m.description);
    }
    pg.close().await;
    Ok(ExitCode::SUCCESS)
}
