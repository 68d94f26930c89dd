//! `shardkeep serve`: the retry worker, the journal worker, periodic reconciliation and the
//! operator HTTP app in one process, shut down gracefully on SIGINT or SIGTERM. Any number of
//! `serve` processes may share one Postgres and one Redis: retry claims skip each other's
//! locked rows, every journal consumer has its own processing list, and recovery takes a lock.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow};
use shardkeep::audit::{AuditReader, AuditStore, StaffReadLimit};
use shardkeep::character::{
    Bookkeeping, BookkeepingRetention, CharacterStore, run_bookkeeping_prune,
};
use shardkeep::clock::SystemClock;
use shardkeep::coord::{InstanceRecord, run_maintenance};
use shardkeep::journal::{JournalWorker, JournalWorkerConfig, SessionJournal};
use shardkeep::queue::{DeadLetterRetention, WorkQueueConfig};
use shardkeep::retry::{Backoff, RetryQueue, RetryWorker, RetryWorkerConfig};
use shardkeep::{Coordination, CoordinationConfig};
use shardkeep_ops::signing::InternalKeys;
use shardkeep_ops::{ApiSettings, AppState};
use tokio_util::sync::CancellationToken;

use crate::cli::ServeArgs;

/// Runs until a signal, then drains.
pub(crate) async fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let keys = InternalKeys::parse(
        args.internal_keys
            .as_deref()
            .ok_or_else(|| anyhow!("SHARDKEEP_INTERNAL_KEYS is not set; pass --internal-keys or set SHARDKEEP_INTERNAL_KEYS"))?,
    )?;
    let pg = super::connect_postgres(&args.postgres, 16).await?;
    if !pg.migrations_current().await.unwrap_or(false) {
        tracing::warn!(
            event = "migrations_pending",
            "run `shardkeep migrate`; /readyz reports not ready until then"
        );
    }
    let redis = super::connect_redis(&args.redis).await?;
    let metrics =
        shardkeep_ops::telemetry::install().map_err(|e| anyhow!("metrics exporter: {e}"))?;
    let coord = Coordination::new(redis.clone(), CoordinationConfig::default());
    let clock = Arc::new(SystemClock);
    let (retry, signals) = RetryQueue::new(pg.clone(), 1024, clock.clone());
    let journal = SessionJournal::new(
        redis.clone(),
        WorkQueueConfig {
            max_attempts: args.retry_limit,
            ..WorkQueueConfig::default()
        },
    )?;
    let instance_id = format!("serve-{}", uuid::Uuid::now_v7());
    let cancel = CancellationToken::new();

    let mut retry_config = RetryWorkerConfig::new(&instance_id);
    retry_config.backoff = Backoff::from_base_millis(args.retry_backoff_millis);
    retry_config.retry_limit = args.retry_limit;
    retry_config.lease_expiry_limit = args.lease_expiry_limit;
    let retry_worker = RetryWorker::new(
        pg.clone(),
        shardkeep_reference::game::ReferenceModel::handle(),
        signals,
        retry_config,
        clock,
    );
    let retry_task = tokio::spawn(retry_worker.run(cancel.clone()));
    let journal_worker = JournalWorker::new(
        journal.clone(),
        coord.clone(),
        CharacterStore::new(pg.clone()),
        JournalWorkerConfig {
            consumer_id: args.consumer_id.clone(),
            ..JournalWorkerConfig::default()
        },
    );
    // Claimed before serving anything: an id held by a live process stops the start-up here.
    let consumer = journal_worker
        .consumer()
        .await
        .context("journal consumer")?;
    let journal_task = tokio::spawn(journal_worker.run_with(consumer, cancel.clone()));
    let record = InstanceRecord {
        instance_id: instance_id.clone(),
        service: "serve".into(),
        address: args.listen.to_string(),
        shard_id: None,
        registered_at: chrono::Utc::now(),
    };
    let reconcile_task = tokio::spawn(run_maintenance(
        coord.clone(),
        record,
        Duration::from_secs(args.reconcile_seconds),
        cancel.clone(),
        |_| {},
    ));
    // Bookkeeping beside the character rows, pruned on the same cadence (every instance may
    // run it: each pass deletes a bounded batch, and two passes at once only share the work).
    let prune_task = tokio::spawn(run_bookkeeping_prune(
        Bookkeeping::new(pg.clone()),
        BookkeepingRetention::default(),
        Duration::from_secs(args.reconcile_seconds),
        cancel.clone(),
        |_| {},
    ));
    let retention = DeadLetterRetention {
        max_age: Duration::from_secs(u64::from(args.dead_letter_max_age_days) * 86_400),
        max_count: args.dead_letter_max_count as usize,
    };
    let retention_task = tokio::spawn(run_dead_letter_retention(
        retry.clone(),
        journal.clone(),
        retention,
        Duration::from_secs(args.reconcile_seconds),
        cancel.clone(),
    ));

    let state = AppState {
        retry,
        journal,
        coord: coord.clone(),
        audit: AuditReader::new(AuditStore::new(pg.clone()), StaffReadLimit::default()),
        pg: pg.clone(),
        keys: Arc::new(keys),
        settings: Arc::new(ApiSettings {
            skew_seconds: i64::from(args.skew_seconds),
            console_password: args.console_password.clone(),
            public_url: args.public_url.clone(),
            trust_forwarded_headers: args.trust_forwarded_headers,
            console_login_client_limit: args.console_login_client_limit,
            console_login_global_limit: args.console_login_global_limit,
            ..ApiSettings::default()
        }),
        metrics: Some(metrics),
    };
    // Readiness as a metric too, so an alert does not depend on someone probing /readyz.
    let ready_task = {
        let (state, cancel) = (state.clone(), cancel.clone());
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(Duration::from_secs(15));
            loop {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    _ = interval.tick() => {}
                }
                shardkeep_ops::routes::health::check(&state).await;
            }
        })
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    println!(
        "serve: listening on http://{} (instance {instance_id})",
        args.listen
    );
    let shutdown = {
        let cancel = cancel.clone();
        async move {
            wait_for_signal().await;
            tracing::info!(event = "shutdown_requested");
            cancel.cancel();
        }
    };
    let app =
        shardkeep_ops::router(state).into_make_service_with_connect_info::<std::net::SocketAddr>();
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .context("http server")?;
    // The workers stop after the work in hand: the retry worker between batches, the journal
    // consumer returning anything it still holds.
    let drain = async {
        let _ = retry_task.await;
        let _ = journal_task.await;
        let _ = reconcile_task.await;
        let _ = prune_task.await;
        let _ = retention_task.await;
        let _ = ready_task.await;
    };
    if tokio::time::timeout(Duration::from_secs(30), drain)
        .await
        .is_err()
    {
        tracing::warn!(event = "shutdown_drain_timeout");
    }
    if let Err(err) = coord.registry_deregister(&instance_id).await {
        tracing::warn!(event = "deregister_failed", error = %err);
    }
    pg.close().await;
    println!("serve: stopped");
    Ok(ExitCode::SUCCESS)
}

/// Prunes both kinds of dead letters every `every` until `cancel` (each pass is bounded; a
/// backlog takes several passes).
async fn run_dead_letter_retention(
    retry: RetryQueue,
    journal: SessionJournal,
    retention: DeadLetterRetention,
    every: Duration,
    cancel: CancellationToken,
) {
    let mut interval = tokio::time::interval(every);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = interval.tick() => {}
        }
        if let Err(err) = retry.dead_letters_prune(retention).await {
            tracing::warn!(event = "dead_letter_retention_failed", kind = "retry", error = %err);
        }
        if let Err(err) = journal.dead_letters_prune(retention).await {
            tracing::warn!(event = "dead_letter_retention_failed", kind = "journal", error = %err);
        }
    }
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
