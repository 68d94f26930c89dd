//! The benchmark report: one row per figure, each set against something measured in the same
//! run (a raw engine operation, a peer, or what the cadence asks for), with the ratio, the goal
//! and whether it was met. Printed as one table; written as JSON with `--json`.

use std::fmt::Write as _;

use serde::Serialize;

/// What a ratio must reach.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum Goal {
    /// No goal: the row is context.
    None,
    /// The ratio must be at least this.
    AtLeast(f64),
    /// The ratio must be at most this.
    AtMost(f64),
}

impl Goal {
    /// Whether `ratio` meets the goal (`None` when there is none).
    pub fn met(self, ratio: f64) -> Option<bool> {
        match self {
            Self::None => None,
            Self::AtLeast(goal) => Some(ratio.is_finite() && ratio >= goal),
            Self::AtMost(goal) => Some(ratio.is_finite() && ratio <= goal),
        }
    }

    fn label(self) -> String {
        match self {
            Self::None => String::new(),
            Self::AtLeast(goal) => format!(">= {goal:.2}x"),
            Self::AtMost(goal) => format!("<= {goal:.2}x"),
        }
    }
}

/// The unit of a row's two figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// Operations per second.
    PerSecond,
    /// Milliseconds.
    Millis,
    /// A count.
    Count,
    /// Bytes.
    Bytes,
}

impl Unit {
    fn format(self, value: f64) -> String {
        match self {
            Self::PerSecond => format!("{}/s", thousands(value)),
            Self::Millis => format!("{value:.1} ms"),
            Self::Count => thousands(value),
            Self::Bytes => format!("{} B", thousands(value)),
        }
    }
}

/// A whole number with thousands separators.
pub fn thousands(value: f64) -> String {
    if !value.is_finite() {
        return "-".into();
    }
    let whole = value.round().abs() as u64;
    let digits = whole.to_string();
    let mut out = String::new();
    if value < -0.5 {
        out.push('-');
    }
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// One figure of the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// The benchmark it comes from (`ladder`, `queue`, …).
    pub bench: String,
    /// What was measured for shardkeep.
    pub metric: String,
    /// shardkeep's figure.
    pub shardkeep: f64,
    /// What it is set against (a raw engine operation, a peer, a budget).
    pub against: String,
    /// The comparison's figure, measured in the same run.
    pub measured: f64,
    /// Unit of both figures.
    pub unit: Unit,
    /// `shardkeep / measured`, or `measured / shardkeep` for figures where lower is better
    /// (latencies), so that a ratio above 1 always means shardkeep does better.
    pub ratio: f64,
    /// What the ratio must reach.
    pub goal: Goal,
    /// Whether it did (`None`: no goal).
    pub met: Option<bool>,
}

impl Row {
    /// A rate or a count where higher is better: ratio = shardkeep / measured.
    pub fn higher_is_better(
        bench: &str,
        metric: impl Into<String>,
        shardkeep: f64,
        against: impl Into<String>,
        measured: f64,
        unit: Unit,
        goal: Goal,
    ) -> Self {
        let ratio = shardkeep / measured;
        Self {
            bench: bench.to_owned(),
            metric: metric.into(),
            shardkeep,
            against: against.into(),
            measured,
            unit,
            ratio,
            goal,
            met: goal.met(ratio),
        }
    }

    /// A latency or a cost where lower is better: ratio = measured / shardkeep, so a ratio of
    /// at least 1 means shardkeep is within what it is set against.
    pub fn lower_is_better(
        bench: &str,
        metric: impl Into<String>,
        shardkeep: f64,
        against: impl Into<String>,
        measured: f64,
        unit: Unit,
        goal: Goal,
    ) -> Self {
        let ratio = measured / shardkeep;
        Self {
            bench: bench.to_owned(),
            metric: metric.into(),
            shardkeep,
            against: against.into(),
            measured,
            unit,
            ratio,
            goal,
            met: goal.met(ratio),
        }
    }
}

/// The whole report.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Table {
    /// Every row, in the order measured.
    pub rows: Vec<Row>,
    /// Free-form lines printed under the table (sizes, settings, what a row means).
    pub notes: Vec<String>,
}

impl Table {
    /// Adds a row.
    pub fn push(&mut self, row: Row) {
        self.rows.push(row);
    }

    /// Adds a note line.
    pub fn note(&mut self, line: impl Into<String>) {
        self.notes.push(line.into());
    }

    /// Appends another table's rows and notes.
    pub fn extend(&mut self, other: Table) {
        self.rows.extend(other.rows);
        self.notes.extend(other.notes);
    }

    /// Rows with a goal that was not met.
    pub fn unmet(&self) -> impl Iterator<Item = &Row> {
        self.rows.iter().filter(|r| r.met == Some(false))
    }

    /// The table as aligned text.
    pub fn render(&self) -> String {
        let header = [
            "bench",
            "metric",
            "shardkeep",
            "against (same run)",
            "measured",
            "ratio",
            "goal",
            "met",
        ];
        let cells: Vec<[String; 8]> = self
            .rows
            .iter()
            .map(|r| {
                [
                    r.bench.clone(),
                    r.metric.clone(),
                    r.unit.format(r.shardkeep),
                    r.against.clone(),
                    r.unit.format(r.measured),
                    if r.ratio.is_finite() {
                        format!("{:.2}x", r.ratio)
                    } else {
                        "-".into()
                    },
                    r.goal.label(),
                    match r.met {
                        None => String::new(),
                        Some(true) => "yes".into(),
                        Some(false) => "NO".into(),
                    },
                ]
            })
            .collect();
        let mut widths = header.map(str::len);
        for row in &cells {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        let mut line = |row: &[String]| {
            let mut text = String::new();
            for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
                // Figures align right, words left.
                if matches!(i, 2 | 4 | 5) {
                    let _ = write!(text, "{cell:>w$}  ");
                } else {
                    let _ = write!(text, "{cell:<w$}  ");
                }
            }
            out.push_str(text.trim_end());
            out.push('\n');
        };
        line(&header.map(str::to_owned));
        line(&widths.map(|w| "-".repeat(w)));
        for row in &cells {
            line(row);
        }
        let met = self.rows.iter().filter(|r| r.met == Some(true)).count();
        let goals = self.rows.iter().filter(|r| r.met.is_some()).count();
        out.push_str(&format!("\n{met} of {goals} goals met\n"));
        for note in &self.notes {
            out.push_str(note);
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_meets_an_at_least_goal_from_its_ratio() {
        let row = Row::higher_is_better(
            "q",
            "m",
            75.0,
            "raw",
            100.0,
            Unit::PerSecond,
            Goal::AtLeast(0.7),
        );
        assert_eq!((row.ratio, row.met), (0.75, Some(true)));
        let row = Row::higher_is_better(
            "q",
            "m",
            65.0,
            "raw",
            100.0,
            Unit::PerSecond,
            Goal::AtLeast(0.7),
        );
        assert_eq!(row.met, Some(false));
    }

    #[test]
    fn a_latency_ratio_is_budget_over_figure() {
        let row = Row::lower_is_better(
            "s",
            "slowest pulse",
            200.0,
            "pulse",
            250.0,
            Unit::Millis,
            Goal::AtLeast(1.0),
        );
        assert_eq!((row.ratio, row.met), (1.25, Some(true)));
    }

    #[test]
    fn a_ratio_that_is_not_a_number_never_meets_a_goal() {
        let row = Row::higher_is_better(
            "q",
            "m",
            0.0,
            "raw",
            0.0,
            Unit::PerSecond,
            Goal::AtLeast(0.5),
        );
        assert_eq!(row.met, Some(false));
        assert!(
            Table {
                rows: vec![row],
                notes: vec![]
            }
            .render()
            .contains("NO")
        );
    }

    #[test]
    fn the_table_aligns_and_counts_goals() {
        let mut table = Table::default();
        table.push(Row::higher_is_better(
            "ladder",
            "checkpoint writes",
            123_456.0,
            "guard script raw",
            150_000.0,
            Unit::PerSecond,
            Goal::AtLeast(0.7),
        ));
        table.push(Row::higher_is_better(
            "ladder",
            "doc",
            600.0,
            "none",
            600.0,
            Unit::Bytes,
            Goal::None,
        ));
        let text = table.render();
        assert!(text.contains("123,456/s"), "{text}");
        assert!(text.contains("0.82x"), "{text}");
        assert!(text.contains("1 of 1 goals met"), "{text}");
        assert_eq!(thousands(1_234_567.4), "1,234,567");
        assert_eq!(thousands(999.0), "999");
    }
}
