//! How a run is shown: the h2spec-like table (text made safe for a
//! terminal), the JSON document for CI, and the exit code.

use serde_json::{json, Value};

use super::{Report, Verdict};
use crate::render::safe;

/// The table: per section, each check `✔`, `✘` with expected and got, or
/// `-` (not applicable), then the totals.
pub fn table(report: &Report) -> String {
    let mut out = format!(
        "acemq conformance check: {} ({}), expecting RabbitMQ {}\n",
        safe(&report.target.to_string()),
        safe(&report.broker),
        report.version.as_str()
    );
    let mut section = "";
    for o in &report.outcomes {
        if o.check.section != section {
            section = o.check.section;
            out.push_str(&format!("\n{section}\n"));
        }
        match o.verdict {
            Verdict::Pass => out.push_str(&format!("  ✔ {}  {}\n", o.check.id, o.check.description)),
            Verdict::Fail => {
                out.push_str(&format!("  ✘ {}  {}\n", o.check.id, o.check.description));
                out.push_str(&format!("      expected: {}\n", o.expected.as_deref().unwrap_or("")));
                out.push_str(&format!("      got:      {}\n", safe(&o.got)));
                if let Some(text) = &o.text {
                    out.push_str(&format!("      text:     {}\n", safe(text)));
                }
            }
            Verdict::NotApplicable => {
                out.push_str(&format!("  - {}  n/a: {}\n", o.check.id, safe(&o.got)));
            }
        }
    }
    let (pass, fail, na) = report.totals();
    out.push_str(&format!(
        "\n{} checks: {pass} passed, {fail} failed, {na} not applicable\n",
        report.outcomes.len()
    ));
    out
}

/// One JSON document: the target, the version, every check with its
/// verdict, expected and got, and the totals.
pub fn json(report: &Report) -> String {
    let (pass, fail, na) = report.totals();
    let checks: Vec<Value> = report
        .outcomes
        .iter()
        .map(|o| {
            json!({
                "id": o.check.id,
                "section": o.check.section,
                "description": o.check.description,
                "verdict": o.verdict.as_str(),
                "expected": o.expected,
                "got": o.got,
                "text": o.text,
            })
        })
        .collect();
    crate::render::json(&json!({
        "target": report.target.to_string(),
        "broker": report.broker,
        "rabbitmq_version": report.version.as_str(),
        "checks": checks,
        "totals": { "checks": report.outcomes.len(), "pass": pass, "fail": fail, "not_applicable": na },
    }))
}

/// 0 if every applicable check passed, 1 otherwise.
pub fn exit_code(report: &Report) -> u8 {
    u8::from(report.totals().1 > 0)
}
