//! `shardkeep dead-letters` and `shardkeep cleanup`: signed calls to `shardkeep serve`, printed
//! as tables. A server error exits non-zero with the server's error code.

use std::process::ExitCode;

use anyhow::anyhow;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};
use shardkeep_ops::client::{ClientError, SignedClient};
use shardkeep_ops::signing::InternalKeys;

use crate::cli::{ApiClientArgs, CleanupArgs, DeadLetterKind, DeadLettersAction, DeadLettersArgs};

fn client(args: &ApiClientArgs) -> anyhow::Result<SignedClient> {
    let spec = args
        .internal_keys
        .as_deref()
        .ok_or_else(|| anyhow!("SHARDKEEP_INTERNAL_KEYS is not set; pass --internal-keys or set SHARDKEEP_INTERNAL_KEYS"))?;
    let keys = InternalKeys::parse(spec)?;
    let (key_id, secret) = match &args.key_id {
        Some(id) => (
            id.as_str(),
            keys.secret(id)
                .ok_or_else(|| anyhow!("--key-id {id:?} is not in SHARDKEEP_INTERNAL_KEYS"))?,
        ),
        None => keys
            .first()
            .ok_or_else(|| anyhow!("SHARDKEEP_INTERNAL_KEYS holds no key"))?,
    };
    Ok(SignedClient::new(&args.api_url, key_id, secret)?)
}

/// Prints a server error as one line and picks the exit status.
fn failed(err: ClientError) -> anyhow::Result<ExitCode> {
    match &err {
        ClientError::Api { .. } => {
            eprintln!("error: {err}");
            Ok(ExitCode::from(3))
        }
        ClientError::Transport { .. } => Err(anyhow!(err)),
    }
}

fn text(value: &Value, field: &str) -> String {
    match value.get(field) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => "-".into(),
        Some(other) => other.to_string(),
    }
}

fn table(headers: &[&str], rows: &[Vec<String>]) {
    let widths: Vec<usize> = headers
        .iter()
        .enumerate()
        .map(|(i, h)| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([h.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
    };
    println!(
        "{}",
        line(headers.iter().map(|h| (*h).to_owned()).collect())
    );
    for row in rows {
        println!("{}", line(row.clone()));
    }
}

/// `shardkeep dead-letters list|requeue`.
pub(crate) async fn dead_letters(args: &DeadLettersArgs) -> anyhow::Result<ExitCode> {
    let client = client(&args.api)?;
    let base = |kind: DeadLetterKind| match kind {
        DeadLetterKind::Retry => "/v1/internal/persistence-retry/dead-letters",
        DeadLetterKind::Journal => "/v1/internal/session-lifecycle-journal/dead-letters",
    };
    match &args.action {
        DeadLettersAction::List { kind, limit } => {
            let answer = match client
                .call(
                    reqwest::Method::GET,
                    &format!("{}?limit={limit}", base(*kind)),
                    None,
                )
                .await
            {
                Ok(answer) => answer,
                Err(err) => return failed(err),
            };
            let letters = answer
                .get("dead_letters")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            match kind {
                DeadLetterKind::Retry => {
                    println!(
                        "pending retry jobs: {}  active dead letters: {}",
                        text(&answer, "pending_retry_jobs"),
                        text(&answer, "active_dead_letters")
                    );
                    let rows: Vec<Vec<String>> = letters
                        .iter()
                        .map(|l| {
                            [
                                "dead_letter_id",
                                "job_kind",
                                "character_id",
                                "failed_attempts",
                                "session_impact",
                                "failed_at",
                                "error",
                            ]
                            .iter()
                            .map(|f| text(l, f))
                            .collect()
                        })
                        .collect();
                    table(
                        &[
                            "DEAD LETTER",
                            "KIND",
                            "CHARACTER",
                            "ATTEMPTS",
                            "IMPACT",
                            "FAILED AT",
                            "ERROR",
                        ],
                        &rows,
                    );
                }
                DeadLetterKind::Journal => {
                    println!(
                        "pending: {}  processing: {}  dead: {}",
                        text(&answer, "pending"),
                        text(&answer, "processing"),
                        text(&answer, "dead")
                    );
                    let rows: Vec<Vec<String>> = letters
                        .iter()
                        .map(|l| {
                            [
                                "dead_letter_id",
                                "character_name",
                                "session_token",
                                "attempts",
                                "failed_at",
                                "error",
                            ]
                            .iter()
                            .map(|f| text(l, f))
                            .collect()
                        })
                        .collect();
                    table(
                        &[
                            "DEAD LETTER",
                            "CHARACTER",
                            "SESSION",
                            "ATTEMPTS",
                            "FAILED AT",
                            "ERROR",
                        ],
                        &rows,
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        DeadLettersAction::Requeue { kind, id } => {
            let body = json!({ "rpc_version": 1, "dead_letter_id": id });
            match client
                .call(
                    reqwest::Method::POST,
                    &format!("{}/requeue", base(*kind)),
                    Some(&body),
                )
                .await
            {
                Ok(answer) if answer.get("requeued") == Some(&Value::Bool(true)) => {
                    let new_id = answer
                        .get("retry_job_id")
                        .or_else(|| answer.get("entry_id"))
                        .map(|v| text(&json!({ "v": v }), "v"));
                    println!("requeued {id} as {}", new_id.unwrap_or_default());
                    Ok(ExitCode::SUCCESS)
                }
                Ok(_) => {
                    eprintln!("error: not_requeued: {id} is unknown or was already requeued");
                    Ok(ExitCode::from(4))
                }
                Err(err) => failed(err),
            }
        }
    }
}

/// `shardkeep cleanup --target … --dry-run|--delete`.
pub(crate) async fn cleanup(args: &CleanupArgs) -> anyhow::Result<ExitCode> {
    let client = client(&args.api)?;
    if args.dry_run {
        let body = json!({ "target": args.target, "mode": "dry_run" });
        return match client
            .call(
                reqwest::Method::POST,
                "/v1/internal/admin/cleanup",
                Some(&body),
            )
            .await
        {
            Ok(report) => {
                table(
                    &["TARGET", "MODE", "MATCHING KEYS", "COMPLETE"],
                    &[vec![
                        text(&report, "target"),
                        "dry run".into(),
                        text(&report, "matched"),
                        text(&report, "complete"),
                    ]],
                );
                Ok(ExitCode::SUCCESS)
            }
            Err(err) => failed(err),
        };
    }
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    let mut deleted = 0u64;
    let mut calls = 0u64;
    loop {
        let body = json!({ "target": args.target, "mode": "delete", "limit": args.batch });
        let report = match client
            .call(
                reqwest::Method::POST,
                "/v1/internal/admin/cleanup",
                Some(&body),
            )
            .await
        {
            Ok(report) => report,
            Err(err) => {
                bar.finish_and_clear();
                return failed(err);
            }
        };
        calls += 1;
        deleted += report.get("deleted").and_then(Value::as_u64).unwrap_or(0);
        bar.set_message(format!(
            "{}: {deleted} keys deleted in {calls} calls",
            args.target
        ));
        bar.tick();
        let complete = report
            .get("complete")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        let progressed = report.get("deleted").and_then(Value::as_u64).unwrap_or(0) > 0;
        if complete || !progressed {
            break;
        }
    }
    bar.finish_and_clear();
    table(
        &["TARGET", "MODE", "DELETED", "CALLS"],
        &[vec![
            args.target.clone(),
            "delete".into(),
            deleted.to_string(),
            calls.to_string(),
        ]],
    );
    Ok(ExitCode::SUCCESS)
}
