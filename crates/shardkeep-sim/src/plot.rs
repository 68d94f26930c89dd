//! Draws a run's time series as one SVG: a panel per series (saves per second, p99 store-call
//! latency, retry and journal depth, process RSS, Redis memory, table sizes), minutes of play
//! along the bottom, the stability verdict in the title.

use std::path::Path;

use plotters::prelude::*;

use crate::series::{BOOKKEEPING_TABLES, Sample, Series};

/// The plot could not be drawn or written.
#[derive(Debug, thiserror::Error)]
#[error("cannot draw the plot to {path}: {message}")]
pub struct PlotError {
    /// Where it was to go.
    pub path: String,
    /// What failed.
    pub message: String,
}

/// One line of a panel: its label, colour and value at each sample (`None` where unread).
type Line<'a> = (&'a str, RGBColor, Box<dyn Fn(&Sample) -> Option<f64> + 'a>);

const MIB: f64 = 1024.0 * 1024.0;

/// Draws `series` to `path` (an SVG), titled with `title` and the verdict.
pub fn draw(series: &Series, title: &str, path: &Path) -> Result<(), PlotError> {
    let fail = |message: String| PlotError {
        path: path.display().to_string(),
        message,
    };
    if series.samples.is_empty() {
        return Err(fail("the run has no samples".into()));
    }
    let verdict = match &series.stability {
        Some(v) if v.stable => format!(
            "stable over {:.0}–{:.0} s",
            v.window_secs.0, v.window_secs.1
        ),
        Some(v) => {
            let names: Vec<&str> = v.grew.iter().map(|g| g.series.as_str()).collect();
            let shown = names.iter().take(2).copied().collect::<Vec<_>>().join(", ");
            match names.len() {
                0..=2 => format!("grew: {shown}"),
                n => format!("grew: {shown} and {} more (see the report)", n - 2),
            }
        }
        None => "not judged".into(),
    };
    let root = SVGBackend::new(path, (1200, 1100)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(e.to_string()))?;
    let root = root
        .titled(&format!("{title} — {verdict}"), ("sans-serif", 22))
        .map_err(|e| fail(e.to_string()))?;
    let panels = root.split_evenly((3, 2));
    let mib = |bytes: Option<u64>| bytes.map(|b| b as f64 / MIB);
    let charts: Vec<(&str, Vec<Line>)> = vec![
        (
            "saves per second",
            vec![(
                "saves/s",
                BLUE,
                Box::new(|s: &Sample| Some(s.saves_per_sec)),
            )],
        ),
        (
            "p99 store call (ms)",
            vec![("p99", RED, Box::new(|s: &Sample| s.p99_save_ms))],
        ),
        (
            "queue depths",
            vec![
                (
                    "retry jobs",
                    MAGENTA,
                    Box::new(|s: &Sample| Some(s.retry_depth as f64)),
                ),
                (
                    "journal entries",
                    CYAN,
                    Box::new(|s: &Sample| Some(s.journal_depth as f64)),
                ),
            ],
        ),
        (
            "process RSS (MiB)",
            vec![
                ("rss", BLACK, Box::new(move |s: &Sample| mib(s.rss_bytes))),
                (
                    "rss less the checker's ledger",
                    BLUE,
                    Box::new(move |s: &Sample| mib(s.rss_less_checker())),
                ),
            ],
        ),
        (
            "Redis used memory (MiB)",
            vec![(
                "redis",
                RED,
                Box::new(move |s: &Sample| mib(s.redis_memory_bytes)),
            )],
        ),
        (
            "Postgres tables (MiB)",
            vec![
                (
                    "all",
                    BLUE,
                    Box::new(|s: &Sample| Some(s.tables_bytes(None) as f64 / MIB)),
                ),
                (
                    "bookkeeping",
                    GREEN,
                    Box::new(|s: &Sample| {
                        Some(s.tables_bytes(Some(&BOOKKEEPING_TABLES)) as f64 / MIB)
                    }),
                ),
                (
                    "audit",
                    MAGENTA,
                    Box::new(|s: &Sample| {
                        Some(s.tables_bytes(Some(&["character_audit"])) as f64 / MIB)
                    }),
                ),
            ],
        ),
    ];
    let minutes = |s: &Sample| s.at_secs / 60.0;
    let x_end = series
        .samples
        .iter()
        .map(minutes)
        .fold(0.0_f64, f64::max)
        .max(0.1);
    for (panel, (caption, lines)) in panels.iter().zip(&charts) {
        let y_end = lines
            .iter()
            .flat_map(|(_, _, value)| series.samples.iter().filter_map(value))
            .fold(0.0_f64, f64::max)
            .max(1.0)
            * 1.1;
        let mut chart = ChartBuilder::on(panel)
            .caption(*caption, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..x_end, 0.0..y_end)
            .map_err(|e| fail(e.to_string()))?;
        chart
            .configure_mesh()
            .x_desc("minutes")
            .draw()
            .map_err(|e| fail(e.to_string()))?;
        for (label, colour, value) in lines {
            let points: Vec<(f64, f64)> = series
                .samples
                .iter()
                .filter_map(|s| value(s).map(|v| (minutes(s), v)))
                .collect();
            let colour = *colour;
            chart
                .draw_series(LineSeries::new(points, colour.stroke_width(2)))
                .map_err(|e| fail(e.to_string()))?
                .label(*label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], colour));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| fail(e.to_string()))?;
    }
    root.present().map_err(|e| fail(e.to_string()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::series::Stability;

    fn series() -> Series {
        let samples = (0..6)
            .map(|i| Sample {
                at_secs: f64::from(i) * 60.0,
                saves_per_sec: 900.0 + f64::from(i),
                p99_save_ms: (i > 0).then_some(4.0),
                retry_depth: 3,
                journal_depth: 1,
                rss_bytes: Some(80 << 20),
                checker_bytes: Some(1 << 20),
                redis_memory_bytes: None,
                table_bytes: [
                    ("characters".to_owned(), 8 << 20),
                    ("reward_grants".to_owned(), 1 << 20),
                ]
                .into_iter()
                .collect(),
            })
            .collect();
        Series {
            interval_secs: 60.0,
            samples,
            stability: Some(Stability {
                stable: true,
                window_secs: (180.0, 300.0),
                samples: 3,
                grew: vec![],
            }),
        }
    }

    #[test]
    fn a_series_draws_every_panel_to_an_svg() {
        let dir = std::env::temp_dir().join(format!("shardkeep-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("series.svg");
        draw(&series(), "soak", &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
        for caption in [
            "saves per second",
            "queue depths",
            "Postgres tables (MiB)",
            "stable over 180–300 s",
        ] {
            assert!(svg.contains(caption), "no {caption:?} in the plot");
        }
    }

    #[test]
    fn an_empty_series_or_an_unwritable_path_is_an_error() {
        let empty = Series::default();
        assert!(draw(&empty, "x", Path::new("/tmp/never.svg")).is_err());
        let err = draw(&series(), "x", Path::new("/nonexistent-dir/plot.svg")).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent-dir/plot.svg"),
            "{err}"
        );
    }
}
