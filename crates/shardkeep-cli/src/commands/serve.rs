//! `shardkeep serve`: the retry worker, the journal worker, periodic reconciliation and the
//! operator HTTP app in one process, shut down gracefully on SIGINT or SIGTERM. Any number of
//! `serve` processes may share one Postgres and one Redis: retry claims skip each other's
//! locked rows, every journal consumer has its own processing list, and recovery takes a lock.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow};
use shardkeep::audit::{AuditReader, StaffReadLimit};
use shardkeep::queue::DeadLetterRetention;
use shardkeep::retry::Backoff;
use shardkeep::{Services, ServicesConfig};
use shardkeep_ops::signing::InternalKeys;
use shardkeep_ops::{ApiSettings, AppState, WorkerWatch};
use shardkeep_reference::game::ReferenceModel;
use tokio_util::sync::CancellationToken;

use crate::cli::ServeArgs;

/// Connects to the engines `DATABASE_URL` (and `REDIS_URL`) name and builds the services: on
/// Postgres and Redis, or on one SQLite file in embedded mode. serve applies the reference
/// game's effects; a game with its own model runs these workers in its own process through
/// `Services`.
async fn connect_services(args: &ServeArgs, config: ServicesConfig) -> anyhow::Result<Services> {
    let url = super::database_url(&args.postgres)?;
    if shardkeep::backend::sqlite::is_sqlite_url(url) {
        super::refuse_mixed_stores()?;
        let db = shardkeep::SqliteBackend::connect("DATABASE_URL", url).await?;
        if !db.migrations_current().await.unwrap_or(false) {
            tracing::warn!(
                event = "migrations_pending",
                "run `shardkeep migrate`; /readyz reports not ready until then"
            );
        }
        let keys =
            shardkeep::Keyspace::new(&args.redis.namespace).context("SHARDKEEP_NAMESPACE")?;
        println!("serve: embedded mode, everything in {}", db.path());
        let clock = Arc::new(shardkeep::clock::SystemClock);
        return Ok(Services::embedded(
            db,
            &keys,
            ReferenceModel::handle(),
            config,
            clock,
        )?);
    }
    let pg = super::connect_postgres(&args.postgres, 16).await?;
    if !pg.migrations_current().await.unwrap_or(false) {
        tracing::warn!(
            event = "migrations_pending",
            "run `shardkeep migrate`; /readyz reports not ready until then"
        );
    }
    if pg.autovacuum_on().await.ok() == Some(false) {
        tracing::warn!(
            event = "autovacuum_off",
            "the Postgres server has autovacuum off: the retry, job-effect and item-lineage \
             tables will bloat without it; turn it on or vacuum them on a schedule"
        );
    }
    let redis = super::connect_redis(&args.redis).await?;
    Ok(Services::build(
        pg,
        redis,
        ReferenceModel::handle(),
        config,
    )?)
}

/// Runs until a signal, then drains.
pub(crate) async fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let keys = InternalKeys::parse(
        args.internal_keys
            .as_deref()
            .ok_or_else(|| anyhow!("SHARDKEEP_INTERNAL_KEYS is not set; pass --internal-keys or set SHARDKEEP_INTERNAL_KEYS"))?,
    )?;
    let metrics =
        shardkeep_ops::telemetry::install().map_err(|e| anyhow!("metrics exporter: {e}"))?;
    let instance_id = format!("serve-{}", uuid::Uuid::now_v7());
    let mut config = ServicesConfig::new(&instance_id, "serve");
    config.address = args.listen.to_string();
    config.retry.backoff = Backoff::from_base_millis(args.retry_backoff_millis);
    config.retry.retry_limit = args.retry_limit;
    config.retry.lease_expiry_limit = args.lease_expiry_limit;
    config.journal_queue.max_attempts = args.retry_limit;
    config.journal_worker.consumer_id = args.consumer_id.clone();
    config.maintenance_every = Duration::from_secs(args.reconcile_seconds);
    config.dead_letter_retention = DeadLetterRetention {
        max_age: Duration::from_secs(u64::from(args.dead_letter_max_age_days) * 86_400),
        max_count: args.dead_letter_max_count as usize,
    };
    let mut services = connect_services(&args, config).await?;
    let cancel = CancellationToken::new();
    // The journal consumer is claimed before anything is served: an id held by a live process
    // stops the start-up here.
    let workers = services
        .spawn_workers(cancel.clone())
        .await
        .context("starting the workers")?;
    let coord = services.coord.clone();
    let stores = services.stores.clone();

    let state = AppState {
        retry: services.retry.clone(),
        journal: services.journal.clone(),
        coord: coord.clone(),
        audit: AuditReader::new(services.audit.clone(), StaffReadLimit::default()),
        stores: services.stores.clone(),
        keys: Arc::new(keys),
        settings: Arc::new(ApiSettings {
            skew_seconds: i64::from(args.skew_seconds),
            console_password: args.console_password.clone(),
            public_url: args.public_url.clone(),
            trust_forwarded_headers: args.trust_forwarded_headers,
            console_login_client_limit: args.console_login_client_limit,
            console_login_global_limit: args.console_login_global_limit,
            stall_after: Duration::from_secs(u64::from(args.stall_seconds)),
            ..ApiSettings::default()
        }),
        metrics: Some(metrics),
        workers: Some(WorkerWatch {
            liveness: workers.liveness.clone(),
            retry_pause: workers.retry_pause.clone(),
        }),
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
    let late = workers.shutdown(Duration::from_secs(30)).await;
    let ready_late = tokio::time::timeout(Duration::from_secs(1), ready_task)
        .await
        .is_err();
    if !late.is_empty() || ready_late {
        tracing::warn!(event = "shutdown_drain_timeout", workers = ?late);
    }
    if let Err(err) = coord.registry_deregister(&instance_id).await {
        tracing::warn!(event = "deregister_failed", error = %err);
    }
    stores.close().await;
    println!("serve: stopped");
    Ok(ExitCode::SUCCESS)
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
