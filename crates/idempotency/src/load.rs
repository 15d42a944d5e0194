//! [`Loader`]: a YAML file, then the environment under the same names.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

/// The sections of this library: every variable under their prefixes must name a key.
const OWN_SECTIONS: [&str; 2] = ["idempotency", "outbox"];

/// The configuration could not be read: a file that is missing or not YAML, an unknown key, a
/// value of the wrong type. The message names the key.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct LoadError(#[from] config::ConfigError);

/// Reads a configuration tree from a YAML file and the environment (the `config` crate does
/// the merging and the typing), then deserializes it, refusing unknown keys where the target
/// type does.
///
/// Environment variables name a key from its top-level section down, levels separated by
/// `__`, `_` standing for `-` inside a level, in any case:
///
/// | variable | key |
/// |---|---|
/// | `IDEMPOTENCY__PERSISTENCE__LOOKUP_BEFORE_ACQUIRE=true` | `idempotency.persistence.lookup-before-acquire` |
/// | `IDEMPOTENCY__DISTRIBUTED_CACHE__FAILURE_POLICY=fail-fast` | `idempotency.distributed-cache.failure-policy` |
/// | `IDEMPOTENCY__OPERATIONS__CREATE_PAYMENT__TTL=7d` | `idempotency.operations.CREATE_PAYMENT.ttl` (an operation name keeps its case) |
/// | `IDEMPOTENCY__PERSISTENCE__TTL=null` | `idempotency.persistence.ttl: null` |
/// | `OUTBOX__RELAY__WORKERS=4` | `outbox.relay.workers` |
///
/// Only variables of the known sections are read (`idempotency`, `outbox`, and those added
/// with [`section`](Self::section)); one with an empty level is an error naming it, and so is
/// any other variable under the `IDEMPOTENCY_` or `OUTBOX_` prefix that names no key
/// (`IDEMPOTENCY_PERSISTENCE_TTL`, `IDEMPOTENCY_PERSISTENCE__TTL`): a misspelled setting stops
/// the load instead of leaving its default in force. The value
/// `null` is YAML's null. A variable overrides the file. Operation names are taken as written,
/// so only names of letters, digits and `_` can be set from the environment; others
/// (`POST:/v2/payments`) go in the file.
///
/// ```
/// use idempotency::{Loader, Settings};
///
/// let settings: Settings = Loader::new()
///     .environment([
///         ("IDEMPOTENCY__OPERATIONS__CREATE_PAYMENT__TTL", "7d"),
///         ("IDEMPOTENCY__PERSISTENCE__TTL", "null"),
///     ])
///     .load()?;
/// assert_eq!(settings.idempotency.persistence.ttl, None);
/// assert!(settings.idempotency.operations.contains_key("CREATE_PAYMENT"));
/// # Ok::<(), idempotency::LoadError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Loader {
    file: Option<(PathBuf, bool)>,
    sections: Vec<String>,
    environment: Option<Vec<(String, String)>>,
}

impl Default for Loader {
    fn default() -> Self {
        Self::new()
    }
}

impl Loader {
    /// A loader of the `idempotency` and `outbox` sections from the process environment.
    pub fn new() -> Self {
        Self {
            file: None,
            sections: OWN_SECTIONS.map(str::to_owned).to_vec(),
            environment: None,
        }
    }

    /// Reads `path` first (YAML); it must exist.
    pub fn file(mut self, path: impl AsRef<Path>) -> Self {
        self.file = Some((path.as_ref().to_owned(), true));
        self
    }

    /// Reads `path` first when it exists.
    pub fn optional_file(mut self, path: impl AsRef<Path>) -> Self {
        self.file = Some((path.as_ref().to_owned(), false));
        self
    }

    /// Also reads environment variables of the application's own top-level section `name`
    /// (`server` reads `SERVER__PORT`).
    pub fn section(mut self, name: &str) -> Self {
        self.sections
            .push(name.to_ascii_lowercase().replace('_', "-"));
        self
    }

    /// Reads these variables instead of the process environment (for tests, or a
    /// pre-filtered environment).
    pub fn environment<K: Into<String>, V: Into<String>>(
        mut self,
        variables: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.environment = Some(
            variables
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        );
        self
    }

    /// Merges the file and the environment and deserializes the result.
    pub fn load<T: DeserializeOwned>(&self) -> Result<T, LoadError> {
        Ok(self.merged()?.try_deserialize()?)
    }

    /// Loads the application's own top-level section `name` as `A` and
    /// [`Settings`](crate::Settings) from the same file and environment (`name`'s variables
    /// too: `APP__PORT` for `app.port`). Each refuses its own unknown keys: the settings every top-level key other than
    /// `idempotency`, `outbox` and `name`, and `A` whatever it refuses
    /// (`#[serde(deny_unknown_fields)]`). A file without the section gives `A` an empty table
    /// (its `#[serde(default)]`s).
    ///
    /// ```
    /// #[derive(Debug, serde::Deserialize)]
    /// #[serde(deny_unknown_fields)]
    /// struct App { port: u16 }
    ///
    /// let (app, settings): (App, idempotency::Settings) = idempotency::Loader::new()
    ///     .environment([("APP__PORT", "8080"), ("IDEMPOTENCY__PERSISTENCE__TTL", "7d")])
    ///     .load_with("app")?;
    /// assert_eq!(app.port, 8080);
    /// assert_eq!(settings.idempotency.persistence.ttl, Some(std::time::Duration::from_secs(7 * 86_400)));
    /// let typo = idempotency::Loader::new()
    ///     .environment([("APP__PORT", "8080"), ("APP__PROT", "1")])
    ///     .load_with::<App>("app");
    /// assert!(typo.unwrap_err().to_string().contains("prot"));
    /// # Ok::<(), idempotency::LoadError>(())
    /// ```
    pub fn load_with<A: DeserializeOwned>(
        &self,
        name: &str,
    ) -> Result<(A, crate::Settings), LoadError> {
        let name = name.to_ascii_lowercase().replace('_', "-");
        if OWN_SECTIONS.contains(&name.as_str()) {
            return Err(config::ConfigError::Message(format!(
                "{name}: is this library's section; give the application's section another name"
            ))
            .into());
        }
        let loader = self.clone().section(&name);
        let merged = loader.merged()?;
        let mut table = merged.cache.into_table()?;
        let app = table.remove(&name).unwrap_or_else(|| {
            config::Value::new(None, config::Map::<String, config::Value>::new())
        });
        let app = app
            .try_deserialize::<A>()
            .map_err(|error| config::ConfigError::Message(format!("{name}: {error}")))?;
        let rest = config::Value::new(None, table);
        Ok((app, rest.try_deserialize()?))
    }

    /// The file and the environment merged, with whole numbers checked.
    fn merged(&self) -> Result<config::Config, LoadError> {
        let mut builder = config::Config::builder();
        if let Some((path, required)) = &self.file {
            builder = builder.add_source(config::File::from(path.as_path()).required(*required));
        }
        let variables = match &self.environment {
            Some(variables) => variables.clone(),
            // Variables that are not UTF-8 cannot name a key: skipped, not a panic.
            None => std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
                .collect(),
        };
        for (name, value) in variables {
            let Some(key) = self.key_of(&name).map_err(config::ConfigError::Message)? else {
                continue;
            };
            builder = if value == "null" {
                builder.set_override(key, config::Value::new(None, config::ValueKind::Nil))?
            } else {
                builder.set_override(key, value)?
            };
        }
        let config = builder.build()?;
        whole_numbers(&config.cache)?;
        Ok(config)
    }

    /// The key a variable names; `None` when it belongs to no known section, or is the bare
    /// section name (`SERVER=...`, no `__`: not ours); an error for a variable of a known
    /// section with an empty level (`IDEMPOTENCY__`, `IDEMPOTENCY__PERSISTENCE____TTL`).
    fn key_of(&self, name: &str) -> Result<Option<String>, String> {
        // A variable of this library's own prefixes that does not follow the rules names no key
        // (`IDEMPOTENCY_PERSISTENCE_TTL`, `IDEMPOTENCY_PERSISTENCE__TTL`): refused, not skipped,
        // so that a misspelled setting stops start-up instead of leaving the default in force.
        let lower = name.to_ascii_lowercase();
        if let Some(section) = OWN_SECTIONS.iter().find(|section| {
            lower
                .strip_prefix(*section)
                .is_some_and(|rest| rest.starts_with('_') && !rest.starts_with("__"))
        }) {
            return Err(format!(
                "environment variable {name}: names no key; a variable under the {prefix} prefix \
                 separates its levels by `__` and writes `-` as `_` \
                 ({prefix}__PERSISTENCE__LOOKUP_BEFORE_ACQUIRE for \
                 idempotency.persistence.lookup-before-acquire)",
                prefix = section.to_ascii_uppercase(),
            ));
        }
        if !name.contains("__") {
            return Ok(None);
        }
        let mut levels = name.split("__");
        let section = levels
            .next()
            .unwrap_or_default()
            .to_ascii_lowercase()
            .replace('_', "-");
        if !self.sections.contains(&section) {
            return Ok(None);
        }
        let refused = || {
            format!(
                "environment variable {name}: no key (levels are separated by `__`, none empty)"
            )
        };
        let mut key = section;
        let mut any = false;
        for level in levels {
            if level.is_empty() {
                return Err(refused());
            }
            // Operation names are data, not property names: they keep their case.
            let level = if key == "idempotency.operations" {
                level.to_owned()
            } else {
                level.to_ascii_lowercase().replace('_', "-")
            };
            key.push('.');
            key.push_str(&level);
            any = true;
        }
        if any { Ok(Some(key)) } else { Err(refused()) }
    }
}

/// Refuses what the `config` crate would turn into an integer without it being one: `yes`,
/// `on`, `true` (read as 1), `2.6` (rounded). The integer keys are those whose default is an
/// integer in [`Settings`](crate::Settings); the error names the key.
fn whole_numbers(loaded: &config::Value) -> Result<(), config::ConfigError> {
    #[cfg_attr(not(feature = "outbox"), allow(unused_mut))]
    let mut template = crate::Settings::default();
    #[cfg(feature = "outbox")]
    {
        template.outbox = Some(Default::default());
    }
    let template = config::Config::try_from(&template)?.cache;
    let mut integers = Vec::new();
    integer_keys(String::new(), &template, &mut integers);
    for key in integers {
        let Some(value) = value_at(loaded, &key) else {
            continue;
        };
        let whole = match &value.kind {
            config::ValueKind::String(text) => text.parse::<i64>().is_ok(),
            config::ValueKind::Float(number) => number.is_finite() && number.fract() == 0.0,
            config::ValueKind::Boolean(_) => false,
            _ => true,
        };
        if !whole {
            return Err(config::ConfigError::Message(format!(
                "{key}: `{value}` is not a whole number"
            )));
        }
    }
    Ok(())
}

/// The dotted keys of the integer leaves of `tree`.
fn integer_keys(prefix: String, tree: &config::Value, out: &mut Vec<String>) {
    match &tree.kind {
        config::ValueKind::Table(table) => {
            for (name, value) in table {
                let key = if prefix.is_empty() {
                    name.clone()
                } else {
                    format!("{prefix}.{name}")
                };
                integer_keys(key, value, out);
            }
        }
        config::ValueKind::I64(_)
        | config::ValueKind::I128(_)
        | config::ValueKind::U64(_)
        | config::ValueKind::U128(_) => out.push(prefix),
        _ => {}
    }
}

/// The value of `tree` at a dotted `key`, when set.
fn value_at<'a>(tree: &'a config::Value, key: &str) -> Option<&'a config::Value> {
    key.split('.')
        .try_fold(tree, |node, level| match &node.kind {
            config::ValueKind::Table(table) => table.get(level),
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn variables_name_keys_level_by_level() {
        let loader = Loader::new().section("server").section("MY_APP");
        let key = |name: &str| loader.key_of(name);
        assert_eq!(
            key("IDEMPOTENCY__PERSISTENCE__LOOKUP_BEFORE_ACQUIRE"),
            Ok(Some(
                "idempotency.persistence.lookup-before-acquire".to_owned()
            ))
        );
        assert_eq!(
            key("IDEMPOTENCY__OPERATIONS__CREATE_PAYMENT__TTL"),
            Ok(Some("idempotency.operations.CREATE_PAYMENT.ttl".to_owned()))
        );
        assert_eq!(key("SERVER__PORT"), Ok(Some("server.port".to_owned())));
        assert_eq!(
            key("SERVER__OPERATIONS__MAX_CONCURRENT"),
            Ok(Some("server.operations.max-concurrent".to_owned())),
            "only idempotency.operations holds names"
        );
        assert_eq!(key("MY_APP__LEVEL"), Ok(Some("my-app.level".to_owned())));
        assert_eq!(key("DATABASE_URL"), Ok(None));
        assert_eq!(key("PATH"), Ok(None));
        assert_eq!(key("SERVER"), Ok(None), "a bare section name is not ours");
        for malformed in [
            "IDEMPOTENCY__",
            "OUTBOX__",
            "IDEMPOTENCY__PERSISTENCE____TTL",
        ] {
            let error = key(malformed).unwrap_err();
            assert!(error.contains(malformed), "{error}");
        }
    }

    #[test]
    fn a_malformed_variable_fails_the_load_naming_it() {
        let error = Loader::new()
            .environment([("IDEMPOTENCY__PERSISTENCE____TTL", "1d")])
            .load::<crate::Settings>()
            .unwrap_err()
            .to_string();
        assert!(error.contains("IDEMPOTENCY__PERSISTENCE____TTL"), "{error}");
    }
}
