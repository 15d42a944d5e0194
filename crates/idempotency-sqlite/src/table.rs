//! [`TableName`]: a validated, quoted table name in SQLite's `main` database.

use std::fmt;

use crate::error::Error;

/// The longest name part accepted: PostgreSQL's limit, so one configuration fits both stores.
const MAX_IDENTIFIER_LEN: usize = 63;

/// A table name from configuration, checked and quoted so it can never carry SQL.
///
/// Accepts `name` or `main.name`. SQLite has no schemas: a connection sees its `main` database
/// (and any it attaches), so `main.` is the only qualifier accepted and it is dropped; any other
/// qualifier (`billing.records`, written for PostgreSQL) is an error rather than a silent
/// reference to an attached database that the pool's connections do not have.
///
/// The name starts with a letter or `_` and continues with letters, digits, `_` or `$`, at most
/// 63 bytes; names starting with `sqlite_` are reserved by SQLite. It is folded to lower case
/// (SQLite compares ASCII names case-insensitively anyway) and double-quoted in every statement.
///
/// ```
/// use idempotency_sqlite::TableName;
///
/// let table = TableName::parse("main.Idempotency_Records")?;
/// assert_eq!(table.quoted(), r#""idempotency_records""#);
/// assert!(TableName::parse("records; DROP TABLE users").is_err());
/// assert!(TableName::parse("billing.records").is_err());
/// # Ok::<(), idempotency_sqlite::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableName {
    name: String,
    quoted: String,
}

fn invalid(input: &str, reason: &'static str) -> Error {
    Error::InvalidTableName {
        name: input.to_owned(),
        reason,
    }
}

fn check_name(input: &str, part: &str) -> Result<String, Error> {
    let mut bytes = part.bytes();
    match bytes.next() {
        None => return Err(invalid(input, "the name is empty")),
        Some(b) if !(b.is_ascii_alphabetic() || b == b'_') => {
            return Err(invalid(input, "the name must start with a letter or '_'"));
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
        return Err(invalid(input, "the name is longer than 63 bytes"));
    }
    let name = part.to_ascii_lowercase();
    if name.starts_with("sqlite_") {
        return Err(invalid(input, "names starting with 'sqlite_' are reserved"));
    }
    Ok(name)
}

impl TableName {
    /// `idempotency_records`, the default.
    pub(crate) fn default_table() -> Self {
        Self::from_checked("idempotency_records".to_owned())
    }

    fn from_checked(name: String) -> Self {
        Self {
            quoted: format!("\"{name}\""),
            name,
        }
    }

    /// Validates `input` as `name` or `main.name`.
    pub fn parse(input: &str) -> Result<Self, Error> {
        let parts: Vec<&str> = input.split('.').collect();
        let name = match parts.as_slice() {
            [name] => check_name(input, name)?,
            [schema, name] if schema.eq_ignore_ascii_case("main") => check_name(input, name)?,
            [_, _] => {
                return Err(invalid(
                    input,
                    "SQLite has no schemas: use `name` or `main.name`",
                ));
            }
            _ => return Err(invalid(input, "expected `name` or `main.name`")),
        };
        Ok(Self::from_checked(name))
    }

    /// The table name, lower case, unquoted.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The quoted form used in SQL, e.g. `"idempotency_records"`.
    pub fn quoted(&self) -> &str {
        &self.quoted
    }

    /// A quoted name for an object derived from the table: `<table>_<suffix>`, never cut.
    ///
    /// SQLite has no identifier length limit, and tables and indexes share one namespace: a
    /// name cut to 63 bytes could be the table's own (a 63-byte table would then get no expiry
    /// index) or another table's derived name.
    pub fn derived(&self, suffix: &str) -> String {
        format!("\"{}_{suffix}\"", self.name)
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_and_main_qualified_names() {
        let t = TableName::parse("Idempotency_Records").unwrap();
        assert_eq!(t.quoted(), "\"idempotency_records\"");
        assert_eq!(t, TableName::parse("MAIN.idempotency_records").unwrap());
        assert_eq!(t.to_string(), "idempotency_records");
        assert_eq!(
            TableName::parse("_r$2").unwrap().derived("expires_at_idx"),
            "\"_r$2_expires_at_idx\""
        );
        assert_eq!(TableName::default_table().name(), "idempotency_records");
    }

    #[test]
    fn rejects_injection_schemas_and_reserved_names() {
        for bad in [
            "",
            ".",
            "a.",
            ".a",
            "main.",
            "main.a.b",
            "billing.records",
            "temp.records",
            "1table",
            "table name",
            "t\"; DROP TABLE users; --",
            "t;drop",
            "t'x",
            "t-x",
            "t[x]",
            "t`x`",
            "tëst",
            "\"quoted\"",
            "sqlite_master",
            "SQLITE_records",
            &"x".repeat(64),
        ] {
            assert!(
                matches!(TableName::parse(bad), Err(Error::InvalidTableName { .. })),
                "{bad:?} accepted"
            );
        }
        assert!(TableName::parse(&"x".repeat(63)).is_ok());
    }

    #[test]
    fn derived_names_are_never_cut() {
        let t = TableName::parse(&"x".repeat(63)).unwrap();
        assert_eq!(
            t.derived("expires_at_idx"),
            format!("\"{}_expires_at_idx\"", "x".repeat(63))
        );
    }
}
