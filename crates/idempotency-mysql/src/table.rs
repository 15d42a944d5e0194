//! [`TableName`]: a validated, backtick-quoted, optionally database-qualified table name.

use std::fmt;

use crate::error::Error;

/// MySQL's and MariaDB's identifier length limit, in characters (names here are ASCII).
pub(crate) const MAX_IDENTIFIER_LEN: usize = 64;

/// A table name from configuration, checked and quoted so it can never carry SQL.
///
/// Accepts `name` or `database.name` (MySQL calls a schema a database). Each part starts with
/// a letter or `_` and continues with letters, digits, `_` or `$`, at most 64 bytes. Parts are
/// folded to lower case (table names are case-sensitive on Linux servers, case-insensitive on
/// others: lower case is the one spelling that means the same table everywhere) and quoted
/// with backticks in every statement.
///
/// ```
/// use idempotency_mysql::TableName;
///
/// let table = TableName::parse("Billing.Idempotency_Records")?;
/// assert_eq!(table.quoted(), "`billing`.`idempotency_records`");
/// assert!(TableName::parse("records; DROP TABLE users").is_err());
/// assert!(TableName::parse("a`b").is_err());
/// assert!(TableName::parse("a.b.c").is_err());
/// # Ok::<(), idempotency_mysql::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableName {
    database: Option<String>,
    name: String,
    quoted: String,
}

fn invalid(input: &str, reason: &'static str) -> Error {
    Error::InvalidTableName {
        name: input.to_owned(),
        reason,
    }
}

fn check_part(input: &str, part: &str) -> Result<String, Error> {
    let mut bytes = part.bytes();
    match bytes.next() {
        None => return Err(invalid(input, "a name part is empty")),
        Some(b) if !(b.is_ascii_alphabetic() || b == b'_') => {
            return Err(invalid(
                input,
                "a name part must start with a letter or '_'",
            ));
        }
        Some(_) => {}
    }
    if !bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'$') {
        return Err(invalid(
            input,
            "only letters, digits, '_' and '$' are allowed",
        ));
    }
    if part.len() > MAX_IDENTIFIER_LEN {
        return Err(invalid(input, "a name part is longer than 64 bytes"));
    }
    Ok(part.to_ascii_lowercase())
}

impl TableName {
    /// `idempotency_records`, the default.
    pub(crate) fn default_table() -> Self {
        Self::from_parts(None, "idempotency_records".to_owned())
    }

    fn from_parts(database: Option<String>, name: String) -> Self {
        let quoted = match &database {
            Some(database) => format!("`{database}`.`{name}`"),
            None => format!("`{name}`"),
        };
        Self {
            database,
            name,
            quoted,
        }
    }

    /// Validates `input` as `name` or `database.name`.
    pub fn parse(input: &str) -> Result<Self, Error> {
        let parts: Vec<&str> = input.split('.').collect();
        let (database, name) = match parts.as_slice() {
            [name] => (None, check_part(input, name)?),
            [database, name] => (Some(check_part(input, database)?), check_part(input, name)?),
            _ => return Err(invalid(input, "expected `name` or `database.name`")),
        };
        Ok(Self::from_parts(database, name))
    }

    /// The database part, when the name is qualified (else the connection's database).
    pub fn database(&self) -> Option<&str> {
        self.database.as_deref()
    }

    /// The table name, lower case, unquoted, without the database.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The quoted form used in SQL, e.g. `` `billing`.`idempotency_records` ``.
    pub fn quoted(&self) -> &str {
        &self.quoted
    }

    /// The table `<name>_<suffix>` in the same database; `None` when that name would pass the
    /// 64-byte limit (it is never cut: a cut name could be another table's).
    #[cfg_attr(not(feature = "outbox"), allow(dead_code))] // the outbox's counters
    pub(crate) fn sibling(&self, suffix: &str) -> Option<Self> {
        let name = format!("{}_{suffix}", self.name);
        (name.len() <= MAX_IDENTIFIER_LEN).then(|| Self::from_parts(self.database.clone(), name))
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.database {
            Some(database) => write!(f, "{database}.{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_and_qualified_names() {
        let t = TableName::parse("Idempotency_Records").unwrap();
        assert_eq!(t.quoted(), "`idempotency_records`");
        assert_eq!(t.database(), None);
        let q = TableName::parse("Billing.R$1").unwrap();
        assert_eq!(q.quoted(), "`billing`.`r$1`");
        assert_eq!(q.to_string(), "billing.r$1");
        assert_eq!(
            q.sibling("sequences").unwrap().quoted(),
            "`billing`.`r$1_sequences`"
        );
        assert_eq!(TableName::default_table().name(), "idempotency_records");
    }

    #[test]
    fn rejects_injection_and_overlong_names() {
        for bad in [
            "",
            ".",
            "a.",
            ".a",
            "a.b.c",
            "1table",
            "table name",
            "t`; DROP TABLE users; --",
            "t;drop",
            "t'x",
            "t\"x",
            "t-x",
            "tëst",
            "`quoted`",
            &"x".repeat(65),
        ] {
            assert!(
                matches!(TableName::parse(bad), Err(Error::InvalidTableName { .. })),
                "{bad:?} accepted"
            );
        }
        assert!(TableName::parse(&"x".repeat(64)).is_ok());
    }

    #[test]
    fn siblings_are_never_cut() {
        let t = TableName::parse(&"x".repeat(55)).unwrap();
        assert!(t.sibling("sequences").is_none());
        let t = TableName::parse(&"x".repeat(54)).unwrap();
        assert_eq!(t.sibling("sequences").unwrap().name().len(), 64);
    }
}
