//! The simulation report: what was written, fenced, retried and journaled, which faults were
//! injected, and which invariants held. Printed as a table; serialised as JSON for `--report`.

use std::fmt::{self, Write as _};

use serde::Serialize;

use crate::series::{BOOKKEEPING_TABLES, Series};

/// Most example details kept per invariant.
pub const MAX_DETAILS: usize = 20;

/// One invariant's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Invariant {
    /// What it checks.
    pub name: String,
    /// True when no violation was found.
    pub holds: bool,
    /// How many things were checked (rows, keys, items, sessions…).
    pub checked: u64,
    /// Violations found.
    pub violations: u64,
    /// The first violations, in words.
    pub details: Vec<String>,
}

impl Invariant {
    /// A verdict from its violations.
    pub fn new(name: &str, checked: u64, mut details: Vec<String>) -> Self {
        let violations = details.len() as u64;
        details.truncate(MAX_DETAILS);
        Self {
            name: name.to_owned(),
            holds: violations == 0,
            checked,
            violations,
            details,
        }
    }
}

/// Writes to one tier.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TierCounts {
    /// The tier.
    pub tier: String,
    /// Writes attempted.
    pub attempted: u64,
    /// Writes that landed.
    pub landed: u64,
    /// Writes dropped before any attempt (queue full or closed, final given up).
    pub dropped: u64,
    /// Writes that failed (store down, timeout) and were retried or left to the next cadence.
    pub failed: u64,
}

/// The retry jobs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RetryCounts {
    /// Grants the shards' runtimes made (rewards, appearance), each stored as a numbered job
    /// (a store that refuses one leaves the grant to the copy's next save).
    pub queued: u64,
    /// Jobs applied.
    pub applied: u64,
    /// Reward jobs whose grant had already landed with a flush.
    pub already_applied: u64,
    /// Jobs of a copy that lost ownership, deleted unapplied.
    pub superseded: u64,
    /// Attempts that failed and were rescheduled.
    pub retried: u64,
    /// Jobs dead-lettered (the planted poison included).
    pub dead_lettered: u64,
}

/// The journal.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct JournalCounts {
    /// Entries appended by closing streams (each retried by its runtime until it landed).
    pub appended: u64,
    /// Entries whose effects were applied.
    pub processed: u64,
    /// Entries skipped because the session reconnected first.
    pub skipped_reconnected: u64,
    /// Entries skipped because a newer session event of the same character came first (a
    /// handed-off session's cleanup, once the destination's session started, among them).
    pub skipped_stale: u64,
    /// Entries dead-lettered (the planted poison included).
    pub dead_lettered: u64,
}

/// The item transfers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TransferCounts {
    /// Pickups of another player's item (detected transfers).
    pub detected: u64,
    /// Committed with both rows and the audit row.
    pub committed: u64,
    /// Refused (a fence or a version race); the item went back or was voided.
    pub refused: u64,
    /// Items voided with zombie copies: what an evicted copy held (mostly copies of what the live
    /// owner holds) and what a stale copy released (it must not enter another row).
    pub voided: u64,
}

/// The whole report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SimReport {
    /// The run: sizes, seed, faults.
    pub run: serde_json::Value,
    /// Per tier: checkpoint (Redis) and row (Postgres).
    pub tiers: Vec<TierCounts>,
    /// Row writes that lost a version race (and were re-dumped).
    pub conflicts: u64,
    /// Ownership fences fired: fenced row writes, refused checkpoints, zombie evictions.
    pub ownership_fences: u64,
    /// Retry jobs.
    pub retry: RetryCounts,
    /// Journal entries.
    pub journal: JournalCounts,
    /// Audit rows written, by kind.
    pub audit_events: std::collections::BTreeMap<String, u64>,
    /// Item transfers.
    pub transfers: TransferCounts,
    /// What the players did.
    pub activity: std::collections::BTreeMap<String, u64>,
    /// The faults injected, in order.
    pub faults: serde_json::Value,
    /// The invariants.
    pub invariants: Vec<Invariant>,
    /// True when every invariant held.
    pub passed: bool,
    /// Saves, latency, depths, memory and table sizes through the run, and whether they held
    /// steady.
    pub series: super::series::Series,
}

impl SimReport {
    /// Audit rows in total.
    pub fn audit_total(&self) -> u64 {
        self.audit_events.values().sum()
    }
}

impl fmt::Display for SimReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        let _ = writeln!(out, "shardkeep simulation");
        for line in setting_lines(&self.run) {
            let _ = writeln!(out, "  {line}");
        }
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:<22} {:>10} {:>10} {:>10} {:>10}",
            "writes", "attempted", "landed", "dropped", "failed"
        );
        for tier in &self.tiers {
            let _ = writeln!(
                out,
                "{:<22} {:>10} {:>10} {:>10} {:>10}",
                tier.tier, tier.attempted, tier.landed, tier.dropped, tier.failed
            );
        }
        let _ = writeln!(out, "{:<22} {:>10}", "version conflicts", self.conflicts);
        let _ = writeln!(
            out,
            "{:<22} {:>10}",
            "ownership fences", self.ownership_fences
        );
        let _ = writeln!(out);
        let r = &self.retry;
        let _ = writeln!(
            out,
            "retry jobs      granted {}, applied {}, already applied {}, superseded {}, retried {}, dead-lettered {}",
            r.queued, r.applied, r.already_applied, r.superseded, r.retried, r.dead_lettered
        );
        let j = &self.journal;
        let _ = writeln!(
            out,
            "journal         appended {}, processed {}, skipped (reconnected) {}, skipped (older than a newer session event) {}, dead-lettered {}",
            j.appended, j.processed, j.skipped_reconnected, j.skipped_stale, j.dead_lettered
        );
        let kinds: Vec<String> = self
            .audit_events
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let _ = writeln!(
            out,
            "audit events    {} ({})",
            self.audit_total(),
            kinds.join(", ")
        );
        let t = &self.transfers;
        let _ = writeln!(
            out,
            "transfers       detected {}, committed {}, refused {}; zombie items voided {}",
            t.detected, t.committed, t.refused, t.voided
        );
        let activity: Vec<String> = self
            .activity
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let _ = writeln!(out, "activity        {}", activity.join(", "));
        for (n, line) in fault_lines(&self.faults).iter().enumerate() {
            let label = if n == 0 { "faults" } else { "" };
            let _ = writeln!(out, "{label:<15} {line}");
        }
        let _ = writeln!(out);
        if !self.series.samples.is_empty() {
            out.push_str(&series_lines(&self.series));
            let _ = writeln!(out);
        }
        let _ = writeln!(
            out,
            "{:<42} {:>8} {:>10}  verdict",
            "invariant", "checked", "violations"
        );
        for inv in &self.invariants {
            let verdict = if inv.holds { "holds" } else { "FAILED" };
            let _ = writeln!(
                out,
                "{:<42} {:>8} {:>10}  {verdict}",
                inv.name, inv.checked, inv.violations
            );
            for detail in &inv.details {
                let _ = writeln!(out, "    - {detail}");
            }
        }
        let _ = writeln!(out);
        let _ = write!(
            out,
            "{}",
            if self.passed {
                "every invariant holds"
            } else {
                "INVARIANTS FAILED"
            }
        );
        f.write_str(&out)
    }
}

/// One `name value` line per setting of the run (JSON stays in `--report`).
fn setting_lines(run: &serde_json::Value) -> Vec<String> {
    match run {
        serde_json::Value::Object(settings) => settings
            .iter()
            .map(|(name, value)| format!("{:<24} {}", name.replace('_', " "), plain(value)))
            .collect(),
        serde_json::Value::Null => Vec::new(),
        other => vec![plain(other)],
    }
}

/// The fault counts on one line, then one line per planned fault, in order.
fn fault_lines(faults: &serde_json::Value) -> Vec<String> {
    let serde_json::Value::Object(fields) = faults else {
        return match faults {
            serde_json::Value::Null => vec!["none".to_owned()],
            other => vec![plain(other)],
        };
    };
    let counts: Vec<String> = fields
        .iter()
        .filter(|(name, _)| name.as_str() != "planned")
        .map(|(name, value)| format!("{} {}", name.replace('_', " "), plain(value)))
        .collect();
    let mut lines = vec![if counts.is_empty() {
        "none".to_owned()
    } else {
        counts.join(", ")
    }];
    if let Some(serde_json::Value::Array(plan)) = fields.get("planned") {
        if plan.len() <= MAX_FAULT_LINES {
            lines.extend(plan.iter().map(planned_fault));
        } else {
            lines.extend(fault_kinds(plan));
        }
    }
    lines
}

/// Planned faults listed one per line; a longer plan is summed up by kind.
const MAX_FAULT_LINES: usize = 24;

/// `  kill-shard ×60, from 9.1 s to 1779.0 s`, one line per kind of fault.
fn fault_kinds(plan: &[serde_json::Value]) -> Vec<String> {
    let mut kinds: std::collections::BTreeMap<&str, (u64, f64, f64)> = Default::default();
    for fault in plan {
        let at = fault.get("at").and_then(serde_json::Value::as_f64);
        let name = fault.get("fault").and_then(serde_json::Value::as_str);
        if let (Some(at), Some(name)) = (at, name) {
            let kind = kinds.entry(name).or_insert((0, at, at));
            kind.0 += 1;
            kind.1 = kind.1.min(at);
            kind.2 = kind.2.max(at);
        }
    }
    kinds
        .into_iter()
        .map(|(name, (count, first, last))| {
            format!("  {name} ×{count}, from {first:.1} s to {last:.1} s")
        })
        .collect()
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1024.0 * 1024.0))
}

/// The series as a table, then the stability verdict.
fn series_lines(series: &Series) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "series, every {:.0} s (MiB; checker: the simulator's own ledger, inside rss and left \
         out of its verdict; tables: all / bookkeeping / audit)",
        series.interval_secs
    );
    let _ = writeln!(
        out,
        "{:>8} {:>8} {:>8} {:>7} {:>8} {:>7} {:>8} {:>7} {:>22}",
        "at s", "saves/s", "p99 ms", "retry", "journal", "rss", "checker", "redis", "tables"
    );
    for s in &series.samples {
        let tables = format!(
            "{} / {} / {}",
            mib(s.tables_bytes(None)),
            mib(s.tables_bytes(Some(&BOOKKEEPING_TABLES))),
            mib(s.tables_bytes(Some(&["character_audit"])))
        );
        let _ = writeln!(
            out,
            "{:>8.0} {:>8.0} {:>8} {:>7} {:>8} {:>7} {:>8} {:>7} {:>22}",
            s.at_secs,
            s.saves_per_sec,
            s.p99_save_ms
                .map_or("-".to_owned(), |ms| format!("{ms:.1}")),
            s.retry_depth,
            s.journal_depth,
            s.rss_bytes.map_or("-".to_owned(), mib),
            s.checker_bytes.map_or("-".to_owned(), mib),
            s.redis_memory_bytes.map_or("-".to_owned(), mib),
            tables
        );
    }
    let Some(verdict) = &series.stability else {
        let _ = writeln!(
            out,
            "stability       not judged (runs under {} minutes are still filling their tables)",
            crate::series::MIN_JUDGED_RUN.as_secs() / 60
        );
        return out;
    };
    let (from, to) = verdict.window_secs;
    let word = if verdict.stable { "stable" } else { "GREW" };
    let _ = writeln!(
        out,
        "stability       {word} over {from:.0}–{to:.0} s ({} samples)",
        verdict.samples
    );
    for growth in &verdict.grew {
        let why = growth
            .by_design
            .as_deref()
            .map_or(String::new(), |why| format!(" — by design: {why}"));
        let amount = |v: f64| {
            if growth.series.contains("depth") {
                format!("{v:.0}")
            } else {
                format!("{} MiB", mib(v.max(0.0) as u64))
            }
        };
        let _ = writeln!(
            out,
            "    - {} grew {} → {}{why}",
            growth.series,
            amount(growth.from),
            amount(growth.to)
        );
    }
    out
}

/// `at 12.5 s  redis-outage for 3.0 s` / `at 20.0 s  kill-shard on shard 1`.
fn planned_fault(fault: &serde_json::Value) -> String {
    let at = fault.get("at").and_then(serde_json::Value::as_f64);
    let name = fault.get("fault").and_then(serde_json::Value::as_str);
    let (Some(at), Some(name)) = (at, name) else {
        return plain(fault);
    };
    let mut line = format!("  at {at:>6.1} s  {name}");
    if let Some(length) = fault
        .get("length")
        .and_then(serde_json::Value::as_f64)
        .filter(|length| *length > 0.0)
    {
        line.push_str(&format!(" for {length:.1} s"));
    }
    if let Some(shard) = fault.get("shard").and_then(serde_json::Value::as_u64) {
        line.push_str(&format!(" on shard {shard}"));
    }
    line
}

/// A JSON value as plain words: strings unquoted, objects as `name value` pairs.
fn plain(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(text) => text.clone(),
        serde_json::Value::Null => "none".to_owned(),
        serde_json::Value::Array(items) => items.iter().map(plain).collect::<Vec<_>>().join("; "),
        serde_json::Value::Object(fields) => fields
            .iter()
            .map(|(name, value)| format!("{} {}", name.replace('_', " "), plain(value)))
            .collect::<Vec<_>>()
            .join(", "),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_count_violations_and_keep_a_few_examples() {
        let ok = Invariant::new("a", 10, vec![]);
        assert!(ok.holds && ok.violations == 0);
        let bad = Invariant::new("b", 10, (0..50).map(|n| n.to_string()).collect());
        assert!(!bad.holds);
        assert_eq!(bad.violations, 50);
        assert_eq!(bad.details.len(), MAX_DETAILS);
    }

    #[test]
    fn the_table_names_failures() {
        let report = SimReport {
            invariants: vec![Invariant::new("no rollback", 3, vec!["x went back".into()])],
            ..SimReport::default()
        };
        let text = report.to_string();
        assert!(
            text.contains("FAILED") && text.contains("x went back"),
            "{text}"
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["invariants"][0]["holds"], false);
    }

    #[test]
    fn settings_and_the_fault_plan_read_as_lines_not_json() {
        let report = SimReport {
            run: serde_json::json!({ "seed": 7, "redis_namespace": "sim-x", "faults": "all" }),
            faults: serde_json::json!({
                "injected": 2,
                "shards_killed": 1,
                "planned": [
                    { "at": 12.5, "fault": "redis-outage", "length": 3.0, "shard": null },
                    { "at": 20.0, "fault": "kill-shard", "length": 0.0, "shard": 1 },
                ],
            }),
            ..SimReport::default()
        };
        let text = report.to_string();
        assert!(!text.contains('{') && !text.contains('"'), "{text}");
        assert!(text.contains("redis namespace          sim-x"), "{text}");
        assert!(text.contains("injected 2, shards killed 1"), "{text}");
        assert!(
            text.contains("at   12.5 s  redis-outage for 3.0 s\n"),
            "{text}"
        );
        assert!(
            text.contains("at   20.0 s  kill-shard on shard 1\n"),
            "{text}"
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(
            json["faults"]["planned"][1]["shard"], 1,
            "JSON keeps the objects"
        );
    }
}
