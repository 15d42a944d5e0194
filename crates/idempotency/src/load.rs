//! [`Loader`]: a YAML file, then the environment under the same names.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

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
/// with [`section`](Self::section)); the value `null` is YAML's null. A variable overrides the
/// file.
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
            sections: vec!["idempotency".to_owned(), "outbox".to_owned()],
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
        self.sections.push(name.to_owned());
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
        let mut builder = config::Config::builder();
        if let Some((path, required)) = &self.file {
            builder = builder.add_source(config::File::from(path.as_path()).required(*required));
        }
        let variables = match &self.environment {
            Some(variables) => variables.clone(),
            None => std::env::vars().collect(),
        };
        for (name, value) in variables {
            let Some(key) = self.key_of(&name) else {
                continue;
            };
            builder = if value == "null" {
                builder.set_override(key, config::Value::new(None, config::ValueKind::Nil))?
            } else {
                builder.set_override(key, value)?
            };
        }
        Ok(builder.build()?.try_deserialize()?)
    }

    /// The key a variable names, or `None` when it belongs to no known section.
    fn key_of(&self, name: &str) -> Option<String> {
        let mut levels = name.split("__");
        let section = levels.next()?.to_ascii_lowercase().replace('_', "-");
        if !self.sections.contains(&section) {
            return None;
        }
        let mut key = section.clone();
        let mut previous = section;
        let mut any = false;
        for level in levels {
            if level.is_empty() {
                return None;
            }
            // Map keys (operation names) are data, not property names: they keep their case.
            let level = if previous == "operations" {
                level.to_owned()
            } else {
                level.to_ascii_lowercase().replace('_', "-")
            };
            key.push('.');
            key.push_str(&level);
            previous = level;
            any = true;
        }
        any.then_some(key)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn variables_name_keys_level_by_level() {
        let loader = Loader::new().section("server");
        assert_eq!(
            loader.key_of("IDEMPOTENCY__PERSISTENCE__LOOKUP_BEFORE_ACQUIRE"),
            Some("idempotency.persistence.lookup-before-acquire".to_owned())
        );
        assert_eq!(
            loader.key_of("IDEMPOTENCY__OPERATIONS__CREATE_PAYMENT__TTL"),
            Some("idempotency.operations.CREATE_PAYMENT.ttl".to_owned())
        );
        assert_eq!(
            loader.key_of("SERVER__PORT"),
            Some("server.port".to_owned())
        );
        assert_eq!(loader.key_of("DATABASE_URL"), None);
        assert_eq!(loader.key_of("IDEMPOTENCY"), None);
        assert_eq!(loader.key_of("IDEMPOTENCY__"), None);
        assert_eq!(loader.key_of("PATH"), None);
    }
}
