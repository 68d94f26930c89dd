//! `shardkeep dead-letters` and `shardkeep cleanup`: signed calls to `shardkeep serve`, printed
//! as tables. A server error exits non-zero with the server's error code.

use std::process::ExitCode;

use anyhow::anyhow;
use indicatif::{ProgressBar, ProgressStyle};
use shardkeep_ops::client::{ClientError, SignedClient};
use shardkeep_ops::contract::{
    CleanupMode, CleanupReport, CleanupRequest, JournalDeadLetterDetail, JournalDeadLetterList,
    JournalRequeueResponse, OperatorChecks, RequeueRequest, RetryDeadLetterDetail,
    RetryDeadLetterList, RetryRequeueResponse,
};
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

fn or_dash<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".into(), |v| v.to_string())
}

fn yes_no(value: Option<bool>) -> &'static str {
    match value {
        Some(true) => "YES",
        Some(false) => "no",
        None => "unknown",
    }
}

fn print_checks(checks: &OperatorChecks) {
    println!("checks before a requeue:");
    println!("  session impact:             {}", checks.session_impact);
    println!(
        "  session token:              {}",
        or_dash(checks.session_token.as_deref())
    );
    println!(
        "  session active again:       {}",
        yes_no(Some(checks.session_active_again))
    );
    println!(
        "  deletes a resume ledger:    {}",
        yes_no(checks.deletes_resume_ledger)
    );
    println!(
        "  transfer already confirmed: {}",
        yes_no(checks.transfer_already_confirmed)
    );
}

fn print_payload(payload: &serde_json::Value) {
    println!("payload:");
    let pretty = serde_json::to_string_pretty(payload).unwrap_or_else(|_| payload.to_string());
    for line in pretty.lines() {
        println!("  {line}");
    }
}

fn query(limit: u32, offset: u32, character: Option<&str>) -> String {
    let mut query = format!("?limit={limit}&offset={offset}");
    if let Some(character) = character {
        let encoded: String = url::form_urlencoded::byte_serialize(character.as_bytes()).collect();
        query.push_str(&format!("&character={encoded}"));
    }
    query
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

/// `shardkeep dead-letters list|show|requeue`.
pub(crate) async fn dead_letters(args: &DeadLettersArgs) -> anyhow::Result<ExitCode> {
    let client = client(&args.api)?;
    let base = |kind: DeadLetterKind| match kind {
        DeadLetterKind::Retry => "/v1/internal/persistence-retry/dead-letters",
        DeadLetterKind::Journal => "/v1/internal/session-lifecycle-journal/dead-letters",
    };
    match &args.action {
        DeadLettersAction::List {
            kind,
            limit,
            offset,
            character,
        } => {
            let path = format!(
                "{}{}",
                base(*kind),
                query(*limit, *offset, character.as_deref())
            );
            match kind {
                DeadLetterKind::Retry => {
                    let list: RetryDeadLetterList = match client.get(&path).await {
                        Ok(list) => list,
                        Err(err) => return failed(err),
                    };
                    println!(
                        "pending retry jobs: {}  active dead letters: {}",
                        list.pending_retry_jobs, list.active_dead_letters
                    );
                    let rows: Vec<Vec<String>> = list
                        .dead_letters
                        .iter()
                        .map(|l| {
                            vec![
                                l.dead_letter_id.to_string(),
                                l.job_kind.clone(),
                                or_dash(l.character_name.as_deref()),
                                l.character_id.to_string(),
                                l.failed_attempts.to_string(),
                                l.session_impact.clone(),
                                l.failed_at.to_rfc3339(),
                                l.error.clone(),
                            ]
                        })
                        .collect();
                    table(
                        &[
                            "DEAD LETTER",
                            "KIND",
                            "NAME",
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
                    let list: JournalDeadLetterList = match client.get(&path).await {
                        Ok(list) => list,
                        Err(err) => return failed(err),
                    };
                    println!(
                        "pending: {}  processing: {}  dead: {}",
                        list.pending, list.processing, list.dead
                    );
                    let rows: Vec<Vec<String>> = list
                        .dead_letters
                        .iter()
                        .map(|l| {
                            vec![
                                l.dead_letter_id.to_string(),
                                or_dash(l.character_name.as_deref()),
                                or_dash(l.plan.as_deref()),
                                yes_no(l.transfer_confirmed).to_owned(),
                                or_dash(l.session_token.as_deref()),
                                l.attempts.to_string(),
                                l.failed_at.to_rfc3339(),
                                l.error.clone(),
                            ]
                        })
                        .collect();
                    table(
                        &[
                            "DEAD LETTER",
                            "CHARACTER",
                            "PLAN",
                            "TRANSFER CONFIRMED",
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
        DeadLettersAction::Show { kind, id } => {
            let path = format!("{}/{id}", base(*kind));
            match kind {
                DeadLetterKind::Retry => {
                    let detail: RetryDeadLetterDetail = match client.get(&path).await {
                        Ok(detail) => detail,
                        Err(err) => return failed(err),
                    };
                    let l = &detail.dead_letter;
                    println!("retry dead letter {}", l.dead_letter_id);
                    println!("  job:        {} ({})", l.retry_job_id, l.job_kind);
                    println!(
                        "  character:  {} {}",
                        l.character_id,
                        or_dash(l.character_name.as_deref())
                    );
                    println!("  attempts:   {}", l.failed_attempts);
                    println!("  failed at:  {}", l.failed_at.to_rfc3339());
                    println!("  source:     {}", l.source);
                    println!("  error:      {}", l.error);
                    print_checks(&detail.checks);
                    print_payload(&detail.payload);
                }
                DeadLetterKind::Journal => {
                    let detail: JournalDeadLetterDetail = match client.get(&path).await {
                        Ok(detail) => detail,
                        Err(err) => return failed(err),
                    };
                    let l = &detail.dead_letter;
                    println!("journal dead letter {}", l.dead_letter_id);
                    println!("  entry:      {}", or_dash(l.entry_id));
                    println!(
                        "  character:  {} {}",
                        or_dash(l.character_id),
                        or_dash(l.character_name.as_deref())
                    );
                    println!("  plan:       {}", or_dash(l.plan.as_deref()));
                    println!("  attempts:   {}", l.attempts);
                    println!("  failed at:  {}", l.failed_at.to_rfc3339());
                    println!("  error:      {}", l.error);
                    print_checks(&detail.checks);
                    print_payload(&detail.payload);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        DeadLettersAction::Requeue { kind, id } => {
            let request = RequeueRequest {
                rpc_version: 1,
                dead_letter_id: *id,
            };
            let path = format!("{}/requeue", base(*kind));
            let answer = match kind {
                DeadLetterKind::Retry => client
                    .post::<_, RetryRequeueResponse>(&path, &request)
                    .await
                    .map(|a| (a.requeued, a.retry_job_id, a.reason.zip(a.detail))),
                DeadLetterKind::Journal => client
                    .post::<_, JournalRequeueResponse>(&path, &request)
                    .await
                    .map(|a| (a.requeued, a.entry_id, None)),
            };
            match answer {
                Ok((true, new_id, _)) => {
                    println!("requeued {id} as {}", or_dash(new_id));
                    Ok(ExitCode::SUCCESS)
                }
                Ok((false, _, Some((reason, detail)))) => {
                    eprintln!("error: {reason}: {id} was left dead: {detail}");
                    Ok(ExitCode::from(4))
                }
                Ok((false, _, None)) => {
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
        let body = CleanupRequest {
            target: args.target.clone(),
            mode: CleanupMode::DryRun,
            limit: None,
        };
        return match client
            .post::<_, CleanupReport>("/v1/internal/admin/cleanup", &body)
            .await
        {
            Ok(report) => {
                table(
                    &["TARGET", "MODE", "MATCHING KEYS", "COMPLETE"],
                    &[vec![
                        report.target,
                        "dry run".into(),
                        report.matched.to_string(),
                        report.complete.to_string(),
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
        let body = CleanupRequest {
            target: args.target.clone(),
            mode: CleanupMode::Delete,
            limit: usize::try_from(args.batch).ok(),
        };
        let report = match client
            .post::<_, CleanupReport>("/v1/internal/admin/cleanup", &body)
            .await
        {
            Ok(report) => report,
            Err(err) => {
                bar.finish_and_clear();
                return failed(err);
            }
        };
        calls += 1;
        deleted += report.deleted;
        bar.set_message(format!(
            "{}: {deleted} keys deleted in {calls} calls",
            args.target
        ));
        bar.tick();
        if report.complete || report.deleted == 0 {
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
