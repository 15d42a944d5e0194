//! What the operations return besides the stores' own types: one key's record, DDL and schema
//! problems per table, partitions.

use std::time::SystemTime;

use idempotency_core::lease::FencingToken;
use idempotency_core::{IdempotencyRecord, RecordStatus, StoredOutcome};

/// How many characters of an outcome [`KeyView::preview`] keeps.
pub const PREVIEW_CHARS: usize = 200;

/// One key's record as an operator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyView {
    /// `PROCESSING`, `COMPLETED` or `REJECTED`.
    pub status: RecordStatus,
    /// The request fingerprint the record was created with.
    pub fingerprint: String,
    /// When the key was acquired.
    pub created_at: SystemTime,
    /// When the outcome was stored.
    pub completed_at: Option<SystemTime>,
    /// When cleanup may delete it (`None`: kept forever).
    pub expires_at: Option<SystemTime>,
    /// The rejection code of a `REJECTED` record.
    pub rejection_code: Option<String>,
    /// Bytes of the stored outcome's JSON (the value, or the rejection details).
    pub outcome_size: usize,
    /// The first [`PREVIEW_CHARS`] characters of that JSON, `…` appended when cut.
    pub preview: Option<String>,
    /// The lease (fencing) token of a `PROCESSING` record, when it carries one: what names
    /// the claim shown, so that a forced eviction never ends a claim taken over since
    /// ([`Force::Claim`](idempotency_core::admin::Force::Claim)). `None` for a settled
    /// record, and in [`of`](Self::of)'s view (the record alone does not carry it).
    pub lease_token: Option<FencingToken>,
}

impl KeyView {
    /// The view of a record.
    ///
    /// ```
    /// use idempotency::core::{Fingerprint, IdempotencyRecord, StoredOutcome};
    ///
    /// let record = IdempotencyRecord {
    ///     fingerprint: Fingerprint::new("abc".to_owned()),
    ///     outcome: Some(StoredOutcome::Completed { payload: "{\"id\":1}".into() }),
    ///     created_at: std::time::SystemTime::now(),
    ///     completed_at: None,
    ///     expires_at: None,
    ///     execution_span: None,
    /// };
    /// let view = idempotency::ops::KeyView::of(&record);
    /// assert_eq!(view.outcome_size, 8);
    /// assert_eq!(view.preview.as_deref(), Some("{\"id\":1}"));
    /// ```
    pub fn of(record: &IdempotencyRecord) -> Self {
        let (json, code) = match &record.outcome {
            Some(StoredOutcome::Completed { payload }) => (Some(payload.as_str()), None),
            Some(StoredOutcome::Rejected { code, details }) => {
                (details.as_deref(), Some(code.clone()))
            }
            None => (None, None),
        };
        Self {
            status: record.status(),
            fingerprint: record.fingerprint.as_str().to_owned(),
            created_at: record.created_at,
            completed_at: record.completed_at,
            expires_at: record.expires_at,
            rejection_code: code,
            outcome_size: json.map_or(0, str::len),
            preview: json.map(preview),
            lease_token: None,
        }
    }
}

fn preview(json: &str) -> String {
    let mut chars = json.char_indices();
    match chars.nth(PREVIEW_CHARS) {
        Some((cut, _)) => format!("{}…", &json[..cut]),
        None => json.to_owned(),
    }
}

/// Which table a DDL script or a schema check is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TableKind {
    /// `idempotency.persistence.table-name`.
    Records,
    /// What leased claims add to the records table (its columns and token counter).
    Leases,
    /// `outbox.table-name` (plain or time-partitioned) and its sequences table.
    Outbox,
    /// The inbox table, when one is named.
    Inbox,
}

impl TableKind {
    /// `records`, `leases`, `outbox` or `inbox`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Records => "records",
            Self::Leases => "leases",
            Self::Outbox => "outbox",
            Self::Inbox => "inbox",
        }
    }
}

/// The DDL of one table, for the configured name.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TableDdl {
    /// Which table.
    pub kind: TableKind,
    /// Its name, as configured.
    pub table: String,
    /// The statements, ready to run or to copy into a migration.
    pub sql: String,
}

/// What differs between one live table and the canonical schema.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TableProblems {
    /// Which table.
    pub kind: TableKind,
    /// Its name, as configured.
    pub table: String,
    /// Every difference, in words (empty: the table matches).
    pub problems: Vec<String>,
}

/// One partition of a time-partitioned outbox (PostgreSQL).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Partition {
    /// The partition, schema-qualified and quoted.
    pub name: String,
    /// The lower bound (inclusive); `None` for the default partition and `MINVALUE`.
    pub from: Option<SystemTime>,
    /// The upper bound (exclusive); `None` for the default partition and `MAXVALUE`.
    pub to: Option<SystemTime>,
    /// Whether it is the default partition.
    pub default: bool,
}
