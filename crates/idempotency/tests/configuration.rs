//! `CONFIGURATION.md` cannot drift from the code: it lists exactly the keys `Settings` has,
//! the defaults it lists are the defaults (each one, set from the environment under its
//! documented name, changes nothing), and every test it cites exists.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::Path;

use idempotency::{Loader, Settings};

struct Row {
    key: String,
    default: Option<String>,
    tests: Vec<String>,
}

fn rows() -> Vec<Row> {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("CONFIGURATION.md"))
            .unwrap();
    text.lines()
        .filter(|line| line.starts_with("| `"))
        .map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
            assert_eq!(cells.len(), 5, "five columns: {line}");
            let unquote = |cell: &str| {
                cell.strip_prefix('`')
                    .and_then(|c| c.strip_suffix('`'))
                    .map(str::to_owned)
            };
            Row {
                key: unquote(cells[0]).unwrap(),
                default: unquote(cells[1]),
                tests: cells[4]
                    .split("<br>")
                    .filter_map(|t| unquote(t.trim()))
                    .collect(),
            }
        })
        .collect()
}

fn everything() -> Settings {
    Settings {
        outbox: Some(Default::default()),
        ..Settings::default()
    }
}

fn leaves(prefix: &str, value: &serde_json::Value, out: &mut BTreeSet<String>) {
    match value {
        serde_json::Value::Object(map) if prefix == "idempotency.operations" => {
            assert!(map.is_empty());
            out.insert("idempotency.operations.<NAME>.ttl".to_owned());
        }
        serde_json::Value::Object(map) => {
            for (key, value) in map {
                let path = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                leaves(&path, value, out);
            }
        }
        _ => {
            out.insert(prefix.to_owned());
        }
    }
}

#[test]
fn the_table_lists_exactly_the_keys_of_the_code() {
    let mut code = BTreeSet::new();
    leaves("", &serde_json::to_value(everything()).unwrap(), &mut code);
    let documented: BTreeSet<String> = rows().into_iter().map(|row| row.key).collect();
    let missing: Vec<_> = code.difference(&documented).collect();
    let extra: Vec<_> = documented.difference(&code).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "undocumented keys: {missing:?}; documented keys the code does not have: {extra:?}"
    );
}

#[test]
fn every_documented_default_is_the_default() {
    for row in rows() {
        let Some(default) = row.default else {
            assert!(
                row.key.contains("<NAME>"),
                "{}: no default written",
                row.key
            );
            continue;
        };
        // The environment variable the loader documents for the key.
        let variable = row
            .key
            .split('.')
            .map(|level| level.replace('-', "_").to_ascii_uppercase())
            .collect::<Vec<_>>()
            .join("__");
        let loaded: Settings = Loader::new()
            .environment([(variable.clone(), default.clone())])
            .load()
            .unwrap_or_else(|e| panic!("{variable}={default}: {e}"));
        let expected = if row.key.starts_with("outbox.") {
            everything()
        } else {
            Settings::default()
        };
        assert_eq!(
            loaded, expected,
            "{} is documented with default `{default}`, which is not the default",
            row.key
        );
    }
}

#[test]
fn every_cited_test_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for row in rows() {
        assert!(
            !row.tests.is_empty(),
            "{}: no test shows its effect",
            row.key
        );
        for test in &row.tests {
            let (file, function) = test.split_once("::").unwrap();
            let source = std::fs::read_to_string(root.join(file))
                .unwrap_or_else(|e| panic!("{}: {file}: {e}", row.key));
            assert!(
                source.contains(&format!("fn {function}("))
                    || source.contains(&format!("fn {function}<")),
                "{}: {file} has no fn {function}",
                row.key
            );
        }
    }
}
