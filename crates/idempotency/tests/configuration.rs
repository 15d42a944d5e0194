//! The configuration's documentation cannot drift from the code. `CONFIGURATION.md` (for users:
//! key, default, what it does) and `tests/configuration_crosscheck.md` (for maintainers: where
//! each key is read, the tests that show its effect) list exactly the keys `Settings` has, with
//! the same defaults; the defaults are the defaults (each one, set from the environment under
//! its documented name, changes nothing); every test the cross-check cites exists.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::Path;

use idempotency::outbox::config::{
    KafkaPublisherConfig, NatsPublisherConfig, OutboxConfig, PublisherConfig,
    RabbitMqPublisherConfig,
};
use idempotency::{Loader, Settings};

struct Row {
    key: String,
    default: Option<String>,
    tests: Vec<String>,
}

/// The rows of the table(s) of `file`, which have `columns` columns: key, default, ..., and
/// (in the cross-check) the tests last.
fn rows_of(file: &str, columns: usize) -> Vec<Row> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap();
    text.lines()
        .filter(|line| line.starts_with("| `"))
        .map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
            assert_eq!(cells.len(), columns, "{file}: {columns} columns: {line}");
            let unquote = |cell: &str| {
                cell.strip_prefix('`')
                    .and_then(|c| c.strip_suffix('`'))
                    .map(str::to_owned)
            };
            Row {
                key: unquote(cells[0]).unwrap(),
                default: unquote(cells[1]),
                tests: if columns == 5 {
                    cells[4]
                        .split("<br>")
                        .filter_map(|t| unquote(t.trim()))
                        .collect()
                } else {
                    Vec::new()
                },
            }
        })
        .collect()
}

fn rows() -> Vec<Row> {
    rows_of("tests/configuration_crosscheck.md", 5)
}

/// The settings with an outbox section whose publisher is `publisher`.
fn with_publisher(publisher: Option<PublisherConfig>) -> Settings {
    Settings {
        outbox: Some(OutboxConfig {
            publisher,
            ..OutboxConfig::default()
        }),
        ..Settings::default()
    }
}

/// Every shape the settings take: no publisher, and each kind of publisher with its defaults.
fn shapes() -> [Settings; 5] {
    [
        everything(),
        with_publisher(Some(PublisherConfig::Logging)),
        with_publisher(Some(PublisherConfig::Nats(NatsPublisherConfig::default()))),
        with_publisher(Some(PublisherConfig::Rabbitmq(
            RabbitMqPublisherConfig::default(),
        ))),
        with_publisher(Some(
            PublisherConfig::Kafka(KafkaPublisherConfig::default()),
        )),
    ]
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
    for shape in shapes() {
        leaves("", &serde_json::to_value(shape).unwrap(), &mut code);
    }
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
                row.key.contains("<NAME>") || row.key.starts_with("outbox.publisher."),
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
        let [none, _, nats, rabbitmq, kafka] = shapes();
        let expected = if row.key.starts_with("outbox.publisher.nats.") {
            nats
        } else if row.key.starts_with("outbox.publisher.rabbitmq.") {
            rabbitmq
        } else if row.key.starts_with("outbox.publisher.kafka.") {
            kafka
        } else if row.key.starts_with("outbox.") {
            none
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

#[test]
fn the_users_reference_lists_the_same_keys_with_the_same_defaults() {
    let users: Vec<(String, Option<String>)> = rows_of("CONFIGURATION.md", 3)
        .into_iter()
        .map(|row| (row.key, row.default))
        .collect();
    let mut users_sorted = users.clone();
    users_sorted.sort();
    let mut maintainers: Vec<(String, Option<String>)> = rows()
        .into_iter()
        .map(|row| (row.key, row.default))
        .collect();
    maintainers.sort();
    assert_eq!(users_sorted, maintainers);
    let once: BTreeSet<_> = users.iter().map(|(key, _)| key).collect();
    assert_eq!(once.len(), users.len(), "a key listed twice");
}
