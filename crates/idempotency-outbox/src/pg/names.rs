//! [`TableName`] and [`Channel`]: configured identifiers, validated and quoted.

use std::fmt;

use crate::error::Error;

/// PostgreSQL's identifier length limit (`NAMEDATALEN - 1`).
const MAX_IDENTIFIER_LEN: usize = 63;

/// The longest suffix of a name derived from a table name: `_dead_letter_idx` (outbox) and
/// `_received_at_idx` (inbox).
const LONGEST_SUFFIX_LEN: usize = "_dead_letter_idx".len();

/// The longest table name (without schema): its derived names still fit
/// PostgreSQL's 63-byte identifier limit uncut.
pub const MAX_TABLE_NAME_LEN: usize = MAX_IDENTIFIER_LEN - LONGEST_SUFFIX_LEN;

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
/// letters, digits, `_` or `$`. Parts are folded to lower case, as PostgreSQL does for unquoted
/// names, then double-quoted in every statement.
///
/// The schema may have 63 bytes (PostgreSQL's limit), the name at most
/// [`MAX_TABLE_NAME_LEN`] (47): the stores name other objects after the table
/// (`<table>_sequences`, `<table>_pending_idx`, up to `<table>_dead_letter_idx` and
/// `<table>_received_at_idx`), and PostgreSQL cuts longer identifiers to 63 bytes, so that the
/// names of a longer table would collide with each other or with the table itself, and
/// `CREATE ... IF NOT EXISTS` would skip an object without a word. A longer name is refused
/// here, rather than derived names shortened with a hash, so that every object keeps a name an
/// operator can predict and a migration can spell.
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
        if name.len() > MAX_TABLE_NAME_LEN {
            return Err(Error::InvalidName {
                what,
                name: input.to_owned(),
                reason: "the table name (without schema) is longer than 47 bytes, which leaves \
                         no room for the names derived from it (`<table>_dead_letter_idx`...) \
                         within PostgreSQL's 63-byte limit",
            });
        }
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
    /// bytes (never cut for the suffixes the stores use: see [`MAX_TABLE_NAME_LEN`]).
    pub fn derived(&self, suffix: &str) -> String {
        let mut name = format!("{}_{suffix}", self.name);
        name.truncate(MAX_IDENTIFIER_LEN);
        format!("\"{name}\"")
    }

    /// A sibling table in the same schema (`<table>_<suffix>`), cut to 63 bytes (never cut for
    /// the suffixes the stores use: see [`MAX_TABLE_NAME_LEN`]).
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

    #[test]
    fn the_longest_table_name_leaves_room_for_every_derived_name() {
        let schema = "s".repeat(MAX_IDENTIFIER_LEN);
        let t = TableName::parse(&format!("{schema}.{}", "t".repeat(MAX_TABLE_NAME_LEN))).unwrap();
        for suffix in ["dead_letter_idx", "received_at_idx", "sequences"] {
            let derived = format!("{}_{suffix}", t.name());
            assert!(derived.len() <= MAX_IDENTIFIER_LEN, "{derived}");
            assert_eq!(t.derived(suffix), format!("\"{derived}\""));
        }
        assert!(TableName::parse(&"t".repeat(MAX_TABLE_NAME_LEN + 1)).is_err());
    }
}
