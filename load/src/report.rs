//! What a scenario reports: figures (with the design's target next to each where there is
//! one), notes on where the time went, and correctness violations. Rendered as a Markdown
//! table and as JSON.

use serde::Serialize;

/// One figure.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub measure: String,
    pub value: f64,
    pub unit: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<Target>,
}

/// A target from DESIGN.md section 7, and whether this figure meets it.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    pub text: String,
    pub met: bool,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub scenario: String,
    pub params: serde_json::Value,
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
    /// Anything that breaks the log's guarantees, or a scenario that could not run. Any
    /// violation fails the run.
    pub violations: Vec<String>,
    /// The hard deadline stopped the scenario before it finished.
    pub deadline_hit: bool,
    pub elapsed_secs: f64,
}

impl Report {
    pub fn new(scenario: &str, params: &impl Serialize) -> Report {
        Report {
            scenario: scenario.to_string(),
            params: serde_json::to_value(params).unwrap_or_default(),
            ..Report::default()
        }
    }

    /// A report for a scenario that failed to run at all.
    pub fn failed(scenario: &str, error: &anyhow::Error) -> Report {
        Report {
            scenario: scenario.to_string(),
            violations: vec![format!("{scenario} could not run: {error:#}")],
            ..Report::default()
        }
    }

    pub fn figure(&mut self, measure: &str, value: f64, unit: &str) {
        self.rows.push(Row { measure: measure.to_string(), value, unit: unit.to_string(), target: None });
    }

    /// A figure that should be at least `min`.
    pub fn at_least(&mut self, measure: &str, value: f64, unit: &str, min: f64, text: &str) {
        self.figure(measure, value, unit);
        self.target(value >= min, text);
    }

    /// A figure that should be below `max`.
    pub fn below(&mut self, measure: &str, value: f64, unit: &str, max: f64, text: &str) {
        self.figure(measure, value, unit);
        self.target(value < max, text);
    }

    fn target(&mut self, met: bool, text: &str) {
        if let Some(row) = self.rows.last_mut() {
            row.target = Some(Target { text: text.to_string(), met });
        }
    }

    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

/// A number as the table shows it.
pub fn format_value(value: f64, unit: &str) -> String {
    let number = match unit {
        "ms" if value < 10.0 => format!("{value:.2}"),
        "ms" | "s" | "KiB" | "MB/s" | "%" | "x" => format!("{value:.1}"),
        _ if value.abs() >= 1000.0 || value.fract() == 0.0 => thousands(value.round() as i64),
        _ => format!("{value:.1}"),
    };
    match unit {
        "" => number,
        "%" => format!("{number}%"),
        _ => format!("{number} {unit}"),
    }
}

fn thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        out.insert(0, '-');
    }
    out
}

/// The table of every report, then each scenario's notes and violations.
pub fn markdown(reports: &[Report]) -> String {
    let mut out = String::from("| scenario | measure | value | target | met |\n|---|---|---|---|---|\n");
    for report in reports {
        for row in &report.rows {
            let (target, met) = match &row.target {
                Some(t) => (t.text.as_str(), if t.met { "yes" } else { "**no**" }),
                None => ("", ""),
            };
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} |\n",
                report.scenario,
                row.measure,
                format_value(row.value, &row.unit),
                target,
                met
            ));
        }
        if report.rows.is_empty() {
            out.push_str(&format!("| {} | (no figures) | | | |\n", report.scenario));
        }
    }
    for report in reports {
        if report.notes.is_empty() && report.violations.is_empty() && !report.deadline_hit {
            continue;
        }
        out.push_str(&format!("\n**{}** ({:.1} s)\n", report.scenario, report.elapsed_secs));
        if report.deadline_hit {
            out.push_str("- stopped by its hard deadline before it finished\n");
        }
        for note in &report.notes {
            out.push_str(&format!("- {note}\n"));
        }
        for violation in &report.violations {
            out.push_str(&format!("- VIOLATION: {violation}\n"));
        }
    }
    out
}

/// Everything, for `--json FILE`.
pub fn json(reports: &[Report], command: &str) -> serde_json::Value {
    serde_json::json!({
        "date": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "command": command,
        "cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "load_average_at_end": crate::scenarios::load_average(),
        "ok": reports.iter().all(Report::ok),
        "scenarios": reports,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_readable() {
        assert_eq!(format_value(41234.4, "events/s"), "41,234 events/s");
        assert_eq!(format_value(1.234, "ms"), "1.23 ms");
        assert_eq!(format_value(68.04, "%"), "68.0%");
        assert_eq!(format_value(1000.0, ""), "1,000");
        assert_eq!(format_value(-1234567.0, ""), "-1,234,567");
    }

    #[test]
    fn the_table_marks_missed_targets() {
        let mut report = Report::new("x", &());
        report.at_least("speed", 5.0, "events/s", 10.0, ">= 10 events/s");
        report.below("latency", 1.0, "ms", 2.0, "< 2 ms");
        report.violations.push("lost an event".into());
        let table = markdown(&[report]);
        assert!(table.contains("| x | speed | 5 events/s | >= 10 events/s | **no** |"));
        assert!(table.contains("| x | latency | 1.00 ms | < 2 ms | yes |"));
        assert!(table.contains("VIOLATION: lost an event"));
    }
}
