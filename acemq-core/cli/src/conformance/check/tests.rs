//! The catalogue's own tests: ids, sections, and every check's verdict on
//! the expected reply (pass), on another reply (a fail naming both), and
//! when it does not apply; the table and the JSON document.

use std::collections::HashSet;

use super::*;

fn versions() -> [Version; 2] {
    [Version::V3_10, Version::V4_0]
}

/// A reply other than `expected`, of the same kind where there is one.
fn another(expected: &str) -> String {
    if expected.contains("404 NOT_FOUND") {
        expected.replace("404 NOT_FOUND", "406 PRECONDITION_FAILED")
    } else if expected.starts_with("channel.close") || expected.starts_with("connection.close") {
        "channel.close 404 NOT_FOUND".into()
    } else {
        format!("{expected} and then something else")
    }
}

#[test]
fn the_catalogue_has_at_least_60_checks_with_unique_ids_in_their_sections() {
    let all = catalogue();
    assert!(all.len() >= 60, "only {} checks", all.len());
    let mut ids = HashSet::new();
    for c in &all {
        assert!(ids.insert(c.id), "{} twice", c.id);
        assert!(
            c.id.starts_with(&format!("{}.", c.section)),
            "{} not in {}",
            c.id,
            c.section
        );
        assert!(!c.description.is_empty() && !c.description.contains('\n'));
        assert!(
            versions().iter().any(|v| c.expect.of(*v).is_some()),
            "{} expects nothing of any version",
            c.id
        );
    }
    // Sections are contiguous, so the table prints each once.
    let mut seen = Vec::new();
    for c in &all {
        if seen.last() != Some(&c.section) {
            assert!(!seen.contains(&c.section), "section {} split", c.section);
            seen.push(c.section);
        }
    }
}

#[test]
fn every_check_passes_on_its_expected_reply_and_fails_on_another_naming_both() {
    for c in catalogue() {
        for v in versions() {
            let Some(expected) = c.expect.of(v) else {
                let o = judge(&c, v, Got::saw("anything"));
                assert_eq!(o.verdict, Verdict::NotApplicable, "{} on {v:?}", c.id);
                continue;
            };
            let pass = judge(&c, v, Got::Saw(Obs::new(expected)));
            assert_eq!(pass.verdict, Verdict::Pass, "{} on {v:?}", c.id);
            let other = another(expected);
            assert_ne!(other, expected);
            let fail = judge(&c, v, Got::Saw(Obs::with_text(other.clone(), "the broker's words")));
            assert_eq!(fail.verdict, Verdict::Fail, "{} on {v:?}", c.id);
            assert_eq!(fail.expected.as_deref(), Some(expected));
            assert_eq!(fail.got, other);
            let report = Report {
                target: target(),
                version: v,
                broker: "test".into(),
                outcomes: vec![fail],
            };
            let shown = table(&report);
            assert!(shown.contains(&format!("✘ {}", c.id)), "{shown}");
            assert!(shown.contains(&format!("expected: {expected}")), "{shown}");
            assert!(shown.contains(&format!("got:      {other}")), "{shown}");
            assert!(shown.contains("the broker's words"), "{shown}");
            assert_eq!(exit_code(&report), 1);
            let na = judge(&c, v, Got::NotApplicable("no quorum queues".into()));
            assert_eq!(na.verdict, Verdict::NotApplicable);
        }
    }
}

#[test]
fn a_check_for_one_version_is_not_applicable_on_the_other() {
    let only = catalogue()
        .into_iter()
        .filter(|c| matches!(c.expect, Expect::Each { .. }))
        .collect::<Vec<_>>();
    assert!(!only.is_empty());
    for c in only {
        for v in versions() {
            let expected = c.expect.of(v);
            let o = judge(&c, v, Got::Saw(Obs::new(expected.unwrap_or("x"))));
            let want = if expected.is_some() {
                Verdict::Pass
            } else {
                Verdict::NotApplicable
            };
            assert_eq!(o.verdict, want, "{} on {v:?}", c.id);
        }
    }
}

fn target() -> Target {
    Target {
        host: "localhost".into(),
        port: 5672,
        username: "guest".into(),
        password: "secret-password".into(),
        vhost: "/".into(),
    }
}

fn report(outcomes: Vec<Outcome>) -> Report {
    Report {
        target: target(),
        version: Version::V4_0,
        broker: "RabbitMQ 4.0.5".into(),
        outcomes,
    }
}

#[test]
fn the_table_escapes_what_the_broker_wrote_and_never_shows_the_password() {
    let c = catalogue()[0];
    let hostile = "bad\u{1b}]52;c;ZXZpbA==\u{7}\u{1b}[31mred\u{9b}2J\r\nnext";
    let o = judge(
        &c,
        Version::V4_0,
        Got::Saw(Obs::with_text(
            format!("channel.close 404 NOT_FOUND {hostile}"),
            hostile,
        )),
    );
    let shown = table(&report(vec![o]));
    assert!(shown.chars().all(|ch| ch == '\n' || !ch.is_control()), "{shown:?}");
    assert!(shown.contains("\\x1b]52"), "{shown}");
    assert!(!shown.contains("secret-password"));
    let json_text = json(&report(vec![judge(
        &c,
        Version::V4_0,
        Got::Saw(Obs::with_text("x", hostile)),
    )]));
    assert!(!json_text.contains("secret-password"));
    let parsed: serde_json::Value = serde_json::from_str(&json_text).unwrap();
    assert_eq!(parsed["checks"][0]["text"], hostile);
}

#[test]
fn json_totals_match_the_checks() {
    let all = catalogue();
    let outcomes = vec![
        judge(
            &all[0],
            Version::V4_0,
            Got::Saw(Obs::new(all[0].expect.of(Version::V4_0).unwrap())),
        ),
        judge(&all[1], Version::V4_0, Got::saw("something else")),
        judge(&all[2], Version::V4_0, Got::NotApplicable("not here".into())),
    ];
    let r = report(outcomes);
    let v: serde_json::Value = serde_json::from_str(&json(&r)).unwrap();
    assert_eq!(v["totals"]["checks"], 3);
    assert_eq!(v["totals"]["pass"], 1);
    assert_eq!(v["totals"]["fail"], 1);
    assert_eq!(v["totals"]["not_applicable"], 1);
    assert_eq!(v["checks"][1]["verdict"], "fail");
    assert_eq!(v["checks"][1]["got"], "something else");
    assert_eq!(v["rabbitmq_version"], "4.0");
    assert_eq!(exit_code(&r), 1);
    assert!(table(&r).contains("3 checks: 1 passed, 1 failed, 1 not applicable"));
}

#[test]
fn release_strings_name_their_line() {
    assert_eq!(Version::of_release("3.10.8"), Some(Version::V3_10));
    assert_eq!(Version::of_release("3.10"), Some(Version::V3_10));
    assert_eq!(Version::of_release("4.0.5"), Some(Version::V4_0));
    assert_eq!(Version::of_release("3.1"), None);
    assert_eq!(Version::of_release("3.100.1"), None);
    assert_eq!(Version::of_release("4.01"), None);
    assert_eq!(Version::of_release("0.1.0"), None);
    assert_eq!("3.10".parse::<Version>(), Ok(Version::V3_10));
    assert!("3.11".parse::<Version>().is_err());
}

#[test]
fn only_selects_by_substring() {
    let mut o = Options::new(Version::V4_0);
    o.only = Some("quorum.".into());
    let s = selected(&o);
    assert!(!s.is_empty() && s.iter().all(|c| c.id.contains("quorum.")));
}

#[test]
fn the_readme_lists_every_check_and_no_other() {
    let readme = include_str!("../../../README.md");
    let start = readme
        .find("### The checks")
        .expect("README.md has a list of the checks");
    let list = &readme[start..];
    let end = list.find("\n## ").unwrap_or(list.len());
    let listed: Vec<(&str, &str)> = list[..end]
        .lines()
        .filter_map(|l| l.strip_prefix("- `"))
        .filter_map(|l| l.split_once("`: "))
        .collect();
    let all = catalogue();
    let ids: Vec<&str> = all.iter().map(|c| c.id).collect();
    let in_readme: Vec<&str> = listed.iter().map(|(id, _)| *id).collect();
    assert_eq!(
        in_readme, ids,
        "README.md's list of checks is not the catalogue, in order"
    );
    for (c, (_, description)) in all.iter().zip(&listed) {
        assert_eq!(*description, c.description, "README.md describes {} otherwise", c.id);
    }
}
