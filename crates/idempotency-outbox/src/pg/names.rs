//! [`TableName`] and [`Channel`]: configured identifiers, validated and quoted.

use std::fmt;

use crate::error::Error;

/// PostgreSQL's identifier length limit (`NAMEDATALEN - 1`).
const MAX_IDENTIFIER_LEN: usize = 63;

fn check_part(what: &'static str, input: &str, part: &str) -> Result<String, Error> {
    let invalid = |reason: &'static str| Error::InvalidName {
        what,
        name: input.to_owned(),
        reason,
    };
    let mut bytes = part.bytes();
    match bytes.next() {
        None => return Err(invalid("a name part is empty")),
        Some(b) if !(b.is_ascii_alphabetic() || b == b'_') => {
            return Err(invalid("a name part must start with a letter or '_'"));
        }
        Some(_) => {}
    }
    if !bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'$') {
        return Err(invalid("only letters, digits, '_' and '$' are allowed"));
    }
    if part.len() > MAX_IDENTIFIER_LEN {
        return Err(invalid("a name part is longer than 63 bytes"));
    }
    Ok(part.to_ascii_lowercase())
}

/// A table name from configuration, checked and quoted so it can never carry SQL.
///
/// Accepts `name` or `schema.name`; each part starts with a letter or `_` and continues with
/// letters, digits, `_` or `$`, at most 63 bytes. Parts are folded to lower case, as PostgreSQL
/// does for unquoted names, then double-quoted in every statement.
///
/// ```
/// use idempotency_outbox::pg::TableName;
///
/// let table = TableName::parse("Billing.Outbox")?;
/// assert_eq!(table.quoted(), r#""billing"."outbox""#);
/// assert!(TableName::parse("outbox; DROP TABLE users").is_err());
/// # Ok::<(), idempotency_outbox::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableName {
    schema: Option<String>,
    name: String,
    quoted: String,
}

impl TableName {
    /// Validates `input` as `name` or `schema.name`.
    pub fn parse(input: &str) -> Result<Self, Error> {
        let what = "table name";
        let parts: Vec<&str> = input.split('.').collect();
        let (schema, name) = match parts.as_slice() {
            [name] => (None, check_part(what, input, name)?),
            [schema, name] => (
                Some(check_part(what, input, schema)?),
                check_part(what, input, name)?,
            ),
            _ => {
                return Err(Error::InvalidName {
                    what,
                    name: input.to_owned(),
                    reason: "expected `name` or `schema.name`",
                });
            }
        };
        Ok(Self::from_parts(schema, name))
    }

    pub(crate) fn from_parts(schema: Option<String>, name: String) -> Self {
        let quoted = match &schema {
            Some(schema) => format!("\"{schema}\".\"{name}\""),
            None => format!("\"{name}\""),
        };
        Self {
            schema,
            name,
            quoted,
        }
    }

    /// The schema, when the name is qualified.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// The table name without schema.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The quoted form used in SQL, e.g. `"billing"."outbox"`.
    pub fn quoted(&self) -> &str {
        &self.quoted
    }

    /// A quoted, unqualified name for an index of the table (`<table>_<suffix>`), cut to 63
    /// bytes.
    pub fn derived(&self, suffix: &str) -> String {
        let mut name = format!("{}_{suffix}", self.name);
        name.truncate(MAX_IDENTIFIER_LEN);
        format!("\"{name}\"")
    }

    /// A sibling table in the same schema (`<table>_<suffix>`), cut to 63 bytes.
    pub fn sibling(&self, suffix: &str) -> Self {
        let mut name = format!("{}_{suffix}", self.name);
        name.truncate(MAX_IDENTIFIER_LEN);
        Self::from_parts(self.schema.clone(), name)
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.schema {
            Some(schema) => write!(f, "{schema}.{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// A `LISTEN`/`NOTIFY` channel name: letters, digits and `_`, starting with a letter or `_`,
/// at most 63 bytes (sent as a bind parameter by enqueue, quoted by `LISTEN`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Channel(String);

impl Channel {
    /// Validates `input`.
    pub fn parse(input: &str) -> Result<Self, Error> {
        let name = check_part("notify channel", input, input)?;
        if name.contains('$') {
            return Err(Error::InvalidName {
                what: "notify channel",
                name: input.to_owned(),
                reason: "only letters, digits and '_' are allowed",
            });
        }
        Ok(Self(name))
    }

    /// The channel name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        let t = TableName::parse("billing.Outbox").unwrap();
        assert_eq!(
            t.sibling("sequences").quoted(),
            "\"billing\".\"outbox_sequences\""
        );
        assert_eq!(t.derived("pending_idx"), "\"outbox_pending_idx\"");
        for bad in [
            "",
            "a.b.c",
            "1x",
            "x y",
            "x\"; DROP TABLE y; --",
            "x-y",
            "é",
        ] {
            assert!(TableName::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            Channel::parse("Outbox_Events").unwrap().as_str(),
            "outbox_events"
        );
        assert!(Channel::parse("a$b").is_err());
        assert!(Channel::parse("a'b").is_err());
        assert!(Channel::parse(&"c".repeat(64)).is_err());
    }
}
