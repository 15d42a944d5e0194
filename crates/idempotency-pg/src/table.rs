//! [`TableName`]: a validated, quoted, optionally schema-qualified table name, for the
//! records, outbox and inbox tables alike.

use std::fmt;

use crate::error::Error;

/// PostgreSQL's identifier length limit (`NAMEDATALEN - 1`).
const MAX_IDENTIFIER_LEN: usize = 63;

/// A table name from configuration, checked and quoted so it can never carry SQL.
///
/// Accepts `name` or `schema.name`; each part starts with a letter or `_` and continues with
/// letters, digits, `_` or `$`, at most 63 bytes. Parts are folded to lower case, as PostgreSQL
/// does for unquoted names, then double-quoted in every statement.
///
/// ```
/// use idempotency_pg::TableName;
///
/// let table = TableName::parse("Billing.Idempotency_Records")?;
/// assert_eq!(table.quoted(), r#""billing"."idempotency_records""#);
/// assert!(TableName::parse("records; DROP TABLE users").is_err());
/// assert!(TableName::parse("a.b.c").is_err());
/// # Ok::<(), idempotency_pg::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableName {
    schema: Option<String>,
    name: String,
    quoted: String,
}

fn check_part(input: &str, part: &str) -> Result<String, Error> {
    let invalid = |reason: &'static str| Error::InvalidTableName {
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

impl TableName {
    /// `idempotency_records`, the default of the records store.
    pub(crate) fn default_table() -> Self {
        Self::from_parts(None, "idempotency_records".to_owned())
    }

    /// A name already checked (a default, or derived from a checked name).
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

    /// Validates `input` as `name` or `schema.name`.
    pub fn parse(input: &str) -> Result<Self, Error> {
        let parts: Vec<&str> = input.split('.').collect();
        let (schema, name) = match parts.as_slice() {
            [name] => (None, check_part(input, name)?),
            [schema, name] => (Some(check_part(input, schema)?), check_part(input, name)?),
            _ => {
                return Err(Error::InvalidTableName {
                    name: input.to_owned(),
                    reason: "expected `name` or `schema.name`",
                });
            }
        };
        Ok(Self::from_parts(schema, name))
    }

    /// The schema, when the name is qualified.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// The table name without schema.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The quoted form used in SQL, e.g. `"billing"."idempotency_records"`.
    pub fn quoted(&self) -> &str {
        &self.quoted
    }

    /// A quoted name for an object derived from the table (an index, the outbox's counters):
    ///
    /// - `<table>_<suffix>` when that fits PostgreSQL's 63 bytes;
    /// - for a table name of up to 60 bytes, that name cut to 63 bytes, as PostgreSQL itself
    ///   would cut it: at least `_` and two letters of the suffix survive, which keeps the names
    ///   tables created by earlier releases already have (two suffixes with the same first two
    ///   letters, such as the partitioned outbox's `_default` and `_dead_letter_idx` of a
    ///   60-byte name, cut to one name: the stores then give the later one the hashed form
    ///   below);
    /// - for a 61- to 63-byte table name, where a cut name would be the table's own name or
    ///   another derived name (and `CREATE ... IF NOT EXISTS` would then skip the object without
    ///   a word), `<table cut>_<hash>_<suffix>` with 8 hex digits of a hash of the table name.
    ///
    /// ```
    /// let short = idempotency_pg::TableName::parse("records")?;
    /// assert_eq!(short.derived("expires_at_idx"), r#""records_expires_at_idx""#);
    /// let long = idempotency_pg::TableName::parse(&"r".repeat(63))?;
    /// let derived = long.derived("expires_at_idx");
    /// assert!(derived.len() <= 63 + 2 && derived.ends_with(r#"_expires_at_idx""#));
    /// # Ok::<(), idempotency_pg::Error>(())
    /// ```
    pub fn derived(&self, suffix: &str) -> String {
        format!("\"{}\"", self.derived_name(suffix))
    }

    /// A sibling table in the same schema, named like [`derived`](Self::derived) (the outbox's
    /// `<table>_sequences` counters).
    pub fn sibling(&self, suffix: &str) -> Self {
        Self::from_parts(self.schema.clone(), self.derived_name(suffix))
    }

    /// A sibling table whose name always ends with the whole `suffix`: `<table>_<suffix>`, or,
    /// when that is longer than 63 bytes, `<table cut>_<hash>_<suffix>`. For names that differ
    /// only in the suffix (the outbox's time partitions), where a cut suffix would make two
    /// partitions one name.
    pub(crate) fn sibling_with_whole_suffix(&self, suffix: &str) -> Self {
        let full = format!("{}_{suffix}", self.name);
        if full.len() <= MAX_IDENTIFIER_LEN {
            return Self::from_parts(self.schema.clone(), full);
        }
        Self::from_parts(self.schema.clone(), self.hashed_name(suffix))
    }

    /// The names [`derived`](Self::derived) gives `suffixes` (unquoted, in that order), except
    /// that a name equal to the table's own or to an earlier suffix's (cut to 63 bytes, the
    /// suffixes `default` and `dead_letter_idx` of a 60-byte name are both `<name>_de`) is
    /// `<table cut>_<hash>_<suffix>` instead: `CREATE ... IF NOT EXISTS` would otherwise skip
    /// the later object without a word. The first suffix keeps its name, so put the objects
    /// earlier releases created first.
    #[cfg(feature = "outbox")]
    pub(crate) fn derived_names(&self, suffixes: &[&str]) -> Vec<String> {
        let mut names: Vec<String> = Vec::with_capacity(suffixes.len());
        for suffix in suffixes {
            let name = self.derived_name(suffix);
            let taken = name == self.name || names.contains(&name);
            names.push(if taken {
                self.hashed_name(suffix)
            } else {
                name
            });
        }
        names
    }

    /// `<table cut>_<hash>_<suffix>`, with 8 hex digits of a hash of the table name: at most
    /// 63 bytes, the whole suffix kept.
    fn hashed_name(&self, suffix: &str) -> String {
        let hash = idempotency_core::fingerprint::short_hash(&self.name);
        let hash = &hash[..8];
        let keep = MAX_IDENTIFIER_LEN.saturating_sub(suffix.len() + hash.len() + 2);
        let cut = &self.name[..keep.min(self.name.len())];
        format!("{cut}_{hash}_{suffix}")
    }

    fn derived_name(&self, suffix: &str) -> String {
        let mut full = format!("{}_{suffix}", self.name);
        if full.len() <= MAX_IDENTIFIER_LEN {
            return full;
        }
        if self.name.len() + 3 <= MAX_IDENTIFIER_LEN {
            // Names are ASCII (checked by `parse`), so any byte index is a char boundary.
            full.truncate(MAX_IDENTIFIER_LEN);
            return full;
        }
        self.hashed_name(suffix)
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

/// Whether every relation of `names` (quoted, schema-qualified when the table is) exists.
///
/// A catalog lookup only: `to_regclass` takes no lock on the relations, unlike
/// `CREATE INDEX IF NOT EXISTS`, which waits for a SHARE lock on the table even when the index
/// exists, behind every open write transaction on it (and holds every new writer behind it).
/// Unnamed (it runs once per start), so that it also runs behind a transaction pooler.
pub(crate) async fn all_exist(
    conn: &mut sqlx::PgConnection,
    names: &[String],
) -> Result<bool, sqlx::Error> {
    let found: Option<bool> = sqlx::query_scalar(
        "SELECT bool_and(to_regclass(n) IS NOT NULL) FROM unnest($1::text[]) AS n",
    )
    .persistent(false)
    .bind(names)
    .fetch_one(conn)
    .await?;
    Ok(found == Some(true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_and_qualified_names() {
        assert_eq!(
            TableName::parse("idempotency_records").unwrap().quoted(),
            "\"idempotency_records\""
        );
        let t = TableName::parse("billing.records$2").unwrap();
        assert_eq!(t.schema(), Some("billing"));
        assert_eq!(t.name(), "records$2");
        assert_eq!(t.to_string(), "billing.records$2");
        assert_eq!(t.derived("expires_at_idx"), "\"records$2_expires_at_idx\"");
    }

    #[test]
    fn rejects_injection_and_malformed_names() {
        for bad in [
            "",
            ".",
            "a.",
            ".a",
            "a.b.c",
            "1table",
            "table name",
            "t\"; DROP TABLE users; --",
            "t;drop",
            "t'x",
            "t-x",
            "tëst",
            "\"quoted\"",
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
    fn derived_names_fit_the_identifier_limit_and_stay_distinct() {
        let t = TableName::parse(&"x".repeat(63)).unwrap();
        let derived = t.derived("expires_at_idx");
        assert_eq!(derived.len(), 63 + 2);
        assert_ne!(derived, t.quoted(), "not the table's own name");
        let prefix = "p".repeat(55);
        let (a, b) = (
            TableName::parse(&format!("{prefix}_a")).unwrap(),
            TableName::parse(&format!("{prefix}_b")).unwrap(),
        );
        assert_ne!(a.derived("expires_at_idx"), b.derived("expires_at_idx"));
    }

    #[test]
    fn names_up_to_sixty_bytes_keep_the_cut_names_earlier_releases_created() {
        let t = TableName::parse(&"x".repeat(60)).unwrap();
        assert_eq!(t.derived("sequences"), format!("\"{}_se\"", "x".repeat(60)));
        assert_eq!(
            t.derived("pending_idx"),
            format!("\"{}_pe\"", "x".repeat(60))
        );
        assert_eq!(
            t.derived("published_idx"),
            format!("\"{}_pu\"", "x".repeat(60))
        );
        for long in [61, 62, 63] {
            let t = TableName::parse(&"y".repeat(long)).unwrap();
            let (a, b) = (t.derived("pending_idx"), t.derived("published_idx"));
            assert_ne!(a, b, "{long}");
            assert_ne!(t.sibling("sequences"), t, "{long}");
        }
    }

    #[test]
    fn derived_names_that_a_cut_would_make_one_are_told_apart_by_a_hash() {
        let t = TableName::parse(&"x".repeat(60)).unwrap();
        let names = t.derived_names(&["sequences", "default", "dead_letter_idx"]);
        assert_eq!(names[0], format!("{}_se", "x".repeat(60)), "kept");
        assert_eq!(
            names[1],
            format!("{}_de", "x".repeat(60)),
            "the first `_de` kept"
        );
        assert!(names[2].ends_with("_dead_letter_idx") && names[2].len() <= 63);
        for long in 1..=63 {
            let t = TableName::parse(&"z".repeat(long)).unwrap();
            let suffixes = [
                "sequences",
                "default",
                "pending_idx",
                "aggregate_idx",
                "published_idx",
                "dead_letter_idx",
            ];
            let mut names = t.derived_names(&suffixes);
            assert!(
                names.iter().all(|n| n.len() <= 63 && *n != t.name),
                "{long}"
            );
            names.sort();
            names.dedup();
            assert_eq!(names.len(), suffixes.len(), "{long}: all distinct");
        }
    }
}
