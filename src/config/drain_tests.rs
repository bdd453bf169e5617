//! The `[[drain]]` grammar through `parse_env`: defaults, the ladder's
//! timing, and every refusal naming its line and what would be valid.

use super::*;
use crate::config::parse_env;

const FILE: &str = "environments/prod.toml";

fn parse(extra: &str) -> Result<Vec<DrainRule>, Vec<String>> {
    let text = format!(
        "version = \"1.2.3\"\n[rollout]\ndrain_timeout = \"1h\"\nnode_timeout = \"2h\"\n{extra}"
    );
    parse_env(FILE, "prod", &text)
        .map(|e| e.drain)
        .map_err(|d| d.iter().map(ToString::to_string).collect())
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn no_rules_by_default() {
    assert_eq!(parse(""), Ok(Vec::new()));
}

#[test]
fn a_ladder_is_climbed_in_order_and_its_last_rung_holds() {
    let rules = parse(
        "[[drain]]\nname = \"singletons\"\nnamespaces = [\"apps\"]\nselector = \"tier=web\"\n\
         taint = \"5m\"\nladder = [\"restart 10m\", \"wait 20m\", \"skip\"]\n\
         [[drain]]\nladder = [\"evict 10m\", \"delete\"]\nallow_delete = true\n",
    )
    .expect("valid");
    assert_eq!(rules.len(), 2);
    let r = &rules[0];
    assert_eq!(r.name, "singletons");
    assert_eq!(r.taint, Some(Duration::from_secs(300)));
    let min = |m: u64| Duration::from_secs(60 * m);
    assert_eq!(r.rung_at(min(0)), RungKind::Restart);
    assert_eq!(r.rung_at(min(9)), RungKind::Restart);
    assert_eq!(r.rung_at(min(10)), RungKind::Wait);
    assert_eq!(r.rung_at(min(30)), RungKind::Skip);
    assert_eq!(r.rung_at(min(300)), RungKind::Skip);
    assert_eq!(rules[1].name, "drain[2]");
    assert!(rules[1].allow_delete);
    assert_eq!(taint_lead(&rules), min(5));
    // First match wins; a pod of another namespace falls to the catch-all.
    let web = labels(&[("tier", "web")]);
    assert_eq!(
        rule_for(&rules, "apps", &web).map(|r| r.name.as_str()),
        Some("singletons")
    );
    assert_eq!(
        rule_for(&rules, "other", &web).map(|r| r.name.as_str()),
        Some("drain[2]")
    );
}

#[test]
fn a_rung_is_reached_only_when_it_starts_before_the_drain_ends() {
    let rules = parse(
        "[[drain]]\nladder = [\"wait 10m\", \"restart 20m\", \"skip\"]\n\
         [[drain]]\nladder = [\"evict 1h\", \"restart\"]\n\
         [[drain]]\nladder = [\"evict\"]\n",
    )
    .expect("valid");
    let hour = Duration::from_secs(3600);
    assert!(rules[0].reaches(RungKind::Restart, hour));
    assert!(!rules[0].reaches(RungKind::Restart, Duration::from_secs(600)));
    // Starts at drain_timeout: the node is given back first.
    assert!(!rules[1].reaches(RungKind::Restart, hour));
    assert!(!rules[2].reaches(RungKind::Restart, hour));
    assert!(rules[2].reaches(RungKind::Evict, hour));
}

#[test]
fn delete_needs_an_explicit_allow_on_its_rule() {
    let e = parse("[[drain]]\nladder = [\"evict 10m\", \"delete\"]\n").expect_err("refused");
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].contains("prod.toml:6"), "{e:?}");
    assert!(e[0].contains("allow_delete = true"), "{e:?}");
    let e =
        parse("[[drain]]\nladder = [\"delete\"]\nallow_delete = \"yes\"\n").expect_err("refused");
    assert!(e.iter().any(|m| m.contains("boolean")), "{e:?}");
    let e = parse("[[drain]]\nladder = [\"skip\"]\nallow_delete = true\n").expect_err("refused");
    assert!(e[0].contains("no `delete` rung"), "{e:?}");
}

#[test]
fn bad_ladders_are_named_with_their_line_and_what_is_valid() {
    for (ladder, says) in [
        (
            "[\"evict\", \"skip\"]",
            "only the last rung may go without a duration",
        ),
        ("[\"skip\", \"evict 1m\"]", "must be the last rung"),
        ("[\"wait\"]", "`wait` needs a duration"),
        ("[\"evict 0s\"]", "longer than zero"),
        ("[\"evict ten\"]", "such as \"10m\""),
        ("[\"skip 5m\"]", "takes no duration"),
        ("[\"evcit 5m\"]", "did you mean \"evict\"?"),
        ("[\"evict 2h\", \"skip\"]", "not before drain_timeout (1h)"),
        ("[]", "`ladder` is empty"),
        ("\"evict\"", "an array of rungs"),
    ] {
        let e = parse(&format!("[[drain]]\nladder = {ladder}\n")).expect_err(ladder);
        assert!(e[0].contains("prod.toml:6"), "{ladder}: {e:?}");
        assert!(e[0].contains(says), "{ladder}: {e:?}");
    }
}

#[test]
fn bad_matches_are_named() {
    let e = parse("[[drain]]\nselector = \"a b\"\nladder = [\"skip\"]\n").expect_err("selector");
    assert!(
        e[0].contains("prod.toml:6") && e[0].contains("label selector"),
        "{e:?}"
    );
    let e = parse("[[drain]]\nnamespaces = [\"Apps\"]\nladder = [\"skip\"]\n").expect_err("ns");
    assert!(e[0].contains("not a namespace name"), "{e:?}");
    let e = parse("[[drain]]\nladdr = [\"skip\"]\n").expect_err("key");
    assert!(
        e.iter().any(|m| m.contains("did you mean `ladder`?")),
        "{e:?}"
    );
    assert!(
        e.iter()
            .any(|m| m.contains("needs `ladder`") && m.contains("prod.toml:5")),
        "{e:?}"
    );
    let e = parse("[[drain]]\ntaint = \"0s\"\nladder = [\"skip\"]\n").expect_err("taint");
    assert!(e[0].contains("longer than zero"), "{e:?}");
}

#[test]
fn consent_limit_is_off_by_default_and_a_malformed_one_names_its_line() {
    let limit = |extra: &str| {
        let text = format!("version = \"1.2.3\"\n[rollout]\n{extra}");
        parse_env(FILE, "prod", &text)
            .map(|e| e.rollout.consent_limit)
            .map_err(|d| d.iter().map(ToString::to_string).collect::<Vec<_>>())
    };
    assert_eq!(limit(""), Ok(None));
    assert_eq!(
        limit("consent_limit = \"3d\"\n"),
        Ok(Some(Duration::from_secs(3 * 86_400)))
    );
    for (bad, says) in [
        ("\"soon\"", "`consent_limit` must be"),
        ("\"0s\"", "`consent_limit` must be longer than zero"),
        ("72", "`consent_limit`"),
    ] {
        let errs = limit(&format!("consent_limit = {bad}\n")).unwrap_err();
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with(&format!("{FILE}:3:")) && errs[0].contains(says),
            "{bad}: {errs:?}"
        );
    }
}
