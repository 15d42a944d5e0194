//! [`AdminDatabase`]: what the operations need of a database beyond [`Database`]: its DDL, its
//! schema checks, the inbox table and the outbox's partitions.

use std::future::Future;

use idempotency_core::admin::KeyAdmin;
use idempotency_outbox::admin::OutboxAdmin;
use idempotency_outbox::config::{InboxConfig, OutboxConfig};

use super::error::OpsError;
use super::view::{Partition, TableDdl, TableKind, TableProblems};
use crate::{Database, Settings};

/// A database the operator operations ([`Operations`](super::Operations)) run on: its stores
/// implement the admin capabilities, and it knows its DDL and schema checks.
///
/// Implemented for `sqlx::PgPool` (feature `postgres`), `sqlx::SqlitePool` (`sqlite`) and
/// `sqlx::MySqlPool` (`mysql`).
pub trait AdminDatabase: Database<Store: KeyAdmin, Outbox: OutboxAdmin> {
    /// The backend's name in messages: `PostgreSQL`, `SQLite`, `MySQL`.
    const NAME: &'static str;

    /// The DDL of every configured table: records (with the lease columns), the outbox (plain
    /// or partitioned) when `outbox` is configured, the inbox when `inbox` is given.
    fn ddl(settings: &Settings, inbox: Option<&InboxConfig>) -> Result<Vec<TableDdl>, OpsError>;

    /// Every difference between the live tables and their canonical schema, one entry per
    /// table checked (an entry without problems: the table matches).
    fn problems(
        &self,
        store: &Self::Store,
        outbox: Option<&Self::Outbox>,
        inbox: Option<&InboxConfig>,
    ) -> impl Future<Output = Result<Vec<TableProblems>, OpsError>> + Send;

    /// Creates the inbox table (`CREATE ... IF NOT EXISTS`).
    fn create_inbox(
        &self,
        inbox: &InboxConfig,
    ) -> impl Future<Output = Result<(), OpsError>> + Send;

    /// The partitions of a time-partitioned outbox; [`OpsError::Unsupported`] elsewhere.
    fn partitions(
        outbox: &Self::Outbox,
    ) -> impl Future<Output = Result<Vec<Partition>, OpsError>> + Send {
        let _ = outbox;
        async {
            Err(OpsError::Unsupported {
                operation: "outbox partitions",
                reason: format!("{} has no partitioned outbox (PostgreSQL only)", Self::NAME),
            })
        }
    }
}

fn strings<T: ToString>(problems: &[T]) -> Vec<String> {
    problems.iter().map(ToString::to_string).collect()
}

fn entry(kind: TableKind, table: &str, problems: Vec<String>) -> TableProblems {
    TableProblems {
        kind,
        table: table.to_owned(),
        problems,
    }
}

fn ddl_entry(kind: TableKind, table: &str, sql: String) -> TableDdl {
    TableDdl {
        kind,
        table: table.to_owned(),
        sql,
    }
}

fn outbox_of(settings: &Settings) -> Option<&OutboxConfig> {
    settings.outbox.as_ref()
}

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
impl AdminDatabase for sqlx::PgPool {
    const NAME: &'static str = "PostgreSQL";

    fn ddl(settings: &Settings, inbox: Option<&InboxConfig>) -> Result<Vec<TableDdl>, OpsError> {
        use idempotency_pg::TableName;
        let parse = |name: &str| TableName::parse(name).map_err(|e| OpsError::schema(name, e));
        let records = &settings.idempotency.persistence.table_name;
        let mut out = vec![ddl_entry(
            TableKind::Records,
            records,
            idempotency_pg::ddl(&parse(records)?),
        )];
        if let Some(outbox) = outbox_of(settings) {
            let table = parse(&outbox.table_name)?;
            let sql = if outbox.partitioning.enabled {
                format!(
                    "{}\n-- The partitions of each interval are created by \
                     `idempotency outbox partitions create` (or the relay's retention pass).\n",
                    idempotency_pg::outbox_partitioned_ddl(&table)
                )
            } else {
                idempotency_pg::outbox_ddl(&table)
            };
            out.push(ddl_entry(TableKind::Outbox, &outbox.table_name, sql));
        }
        if let Some(inbox) = inbox {
            let sql = idempotency_pg::inbox_ddl(&parse(&inbox.table_name)?);
            out.push(ddl_entry(TableKind::Inbox, &inbox.table_name, sql));
        }
        Ok(out)
    }

    async fn problems(
        &self,
        store: &Self::Store,
        outbox: Option<&Self::Outbox>,
        inbox: Option<&InboxConfig>,
    ) -> Result<Vec<TableProblems>, OpsError> {
        let records = store.table().to_string();
        let fail = |table: &str, e: idempotency_pg::Error| OpsError::schema(table, e);
        let mut out = vec![entry(
            TableKind::Records,
            &records,
            strings(
                &store
                    .schema_problems()
                    .await
                    .map_err(|e| fail(&records, e))?,
            ),
        )];
        let leases = match store.validate_leases().await {
            Ok(()) => Vec::new(),
            Err(idempotency_pg::Error::Schema { problems, .. }) => strings(&problems),
            Err(e) => return Err(fail(&records, e)),
        };
        out.push(entry(TableKind::Leases, &records, leases));
        if let Some(outbox) = outbox {
            let table = outbox.table().to_string();
            let problems = outbox
                .schema_problems()
                .await
                .map_err(|e| OpsError::schema(&table, e))?;
            out.push(entry(TableKind::Outbox, &table, strings(&problems)));
        }
        if let Some(inbox) = inbox {
            let name = &inbox.table_name;
            let table = idempotency_pg::TableName::parse(name).map_err(|e| fail(name, e))?;
            let problems = idempotency_pg::PgInbox::with_table(self.clone(), table)
                .schema_problems()
                .await
                .map_err(|e| OpsError::schema(name, e))?;
            out.push(entry(TableKind::Inbox, name, strings(&problems)));
        }
        Ok(out)
    }

    async fn create_inbox(&self, inbox: &InboxConfig) -> Result<(), OpsError> {
        let name = &inbox.table_name;
        let table =
            idempotency_pg::TableName::parse(name).map_err(|e| OpsError::schema(name, e))?;
        idempotency_pg::PgInbox::with_table(self.clone(), table)
            .create_schema()
            .await
            .map_err(|e| OpsError::schema(name, e))
    }

    async fn partitions(outbox: &Self::Outbox) -> Result<Vec<Partition>, OpsError> {
        if outbox.partitioning().is_none() {
            return Err(OpsError::Unsupported {
                operation: "outbox partitions",
                reason: format!(
                    "outbox {} is configured plain (outbox.partitioning.enabled is false)",
                    outbox.table()
                ),
            });
        }
        Ok(outbox
            .partitions()
            .await?
            .into_iter()
            .map(|p| Partition {
                name: p.name,
                from: p.from.map(std::time::SystemTime::from),
                to: p.to.map(std::time::SystemTime::from),
                default: p.default,
            })
            .collect())
    }
}

#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
impl AdminDatabase for sqlx::SqlitePool {
    const NAME: &'static str = "SQLite";

    fn ddl(settings: &Settings, inbox: Option<&InboxConfig>) -> Result<Vec<TableDdl>, OpsError> {
        use idempotency_sqlite::TableName;
        let parse = |name: &str| TableName::parse(name).map_err(|e| OpsError::schema(name, e));
        let records = &settings.idempotency.persistence.table_name;
        let mut out = vec![ddl_entry(
            TableKind::Records,
            records,
            idempotency_sqlite::ddl(&parse(records)?),
        )];
        if let Some(outbox) = outbox_of(settings) {
            let name = &outbox.table_name;
            let sql = idempotency_sqlite::outbox_ddl(&parse(name)?)
                .map_err(|e| OpsError::schema(name, e))?;
            out.push(ddl_entry(TableKind::Outbox, name, sql));
        }
        if let Some(inbox) = inbox {
            let sql = idempotency_sqlite::inbox_ddl(&parse(&inbox.table_name)?);
            out.push(ddl_entry(TableKind::Inbox, &inbox.table_name, sql));
        }
        Ok(out)
    }

    async fn problems(
        &self,
        store: &Self::Store,
        outbox: Option<&Self::Outbox>,
        inbox: Option<&InboxConfig>,
    ) -> Result<Vec<TableProblems>, OpsError> {
        let records = store.table().to_string();
        let fail = |table: &str, e: idempotency_sqlite::Error| OpsError::schema(table, e);
        let mut out = vec![entry(
            TableKind::Records,
            &records,
            strings(
                &store
                    .schema_problems()
                    .await
                    .map_err(|e| fail(&records, e))?,
            ),
        )];
        let leases = match store.validate_leases().await {
            Ok(()) => Vec::new(),
            Err(idempotency_sqlite::Error::Schema { problems, .. }) => strings(&problems),
            Err(e) => return Err(fail(&records, e)),
        };
        out.push(entry(TableKind::Leases, &records, leases));
        if let Some(outbox) = outbox {
            let table = outbox.table().to_string();
            let problems = outbox
                .schema_problems()
                .await
                .map_err(|e| OpsError::schema(&table, e))?;
            out.push(entry(TableKind::Outbox, &table, strings(&problems)));
        }
        if let Some(inbox) = inbox {
            let name = &inbox.table_name;
            let table = idempotency_sqlite::TableName::parse(name).map_err(|e| fail(name, e))?;
            let problems = idempotency_sqlite::SqliteInbox::with_table(self.clone(), table)
                .map_err(|e| OpsError::schema(name, e))?
                .schema_problems()
                .await
                .map_err(|e| OpsError::schema(name, e))?;
            out.push(entry(TableKind::Inbox, name, strings(&problems)));
        }
        Ok(out)
    }

    async fn create_inbox(&self, inbox: &InboxConfig) -> Result<(), OpsError> {
        let name = &inbox.table_name;
        let table =
            idempotency_sqlite::TableName::parse(name).map_err(|e| OpsError::schema(name, e))?;
        idempotency_sqlite::SqliteInbox::with_table(self.clone(), table)
            .map_err(|e| OpsError::schema(name, e))?
            .create_schema()
            .await
            .map_err(|e| OpsError::schema(name, e))
    }
}

#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
impl AdminDatabase for sqlx::MySqlPool {
    const NAME: &'static str = "MySQL";

    fn ddl(settings: &Settings, inbox: Option<&InboxConfig>) -> Result<Vec<TableDdl>, OpsError> {
        use idempotency_mysql::TableName;
        let parse = |name: &str| TableName::parse(name).map_err(|e| OpsError::schema(name, e));
        let records = &settings.idempotency.persistence.table_name;
        let sql =
            idempotency_mysql::ddl(&parse(records)?).map_err(|e| OpsError::schema(records, e))?;
        let mut out = vec![ddl_entry(TableKind::Records, records, sql)];
        if let Some(outbox) = outbox_of(settings) {
            let name = &outbox.table_name;
            let sql = idempotency_mysql::outbox_ddl(&parse(name)?)
                .map_err(|e| OpsError::schema(name, e))?;
            out.push(ddl_entry(TableKind::Outbox, name, sql));
        }
        if let Some(inbox) = inbox {
            let sql = idempotency_mysql::inbox_ddl(&parse(&inbox.table_name)?);
            out.push(ddl_entry(TableKind::Inbox, &inbox.table_name, sql));
        }
        Ok(out)
    }

    async fn problems(
        &self,
        store: &Self::Store,
        outbox: Option<&Self::Outbox>,
        inbox: Option<&InboxConfig>,
    ) -> Result<Vec<TableProblems>, OpsError> {
        let records = store.table().to_string();
        let fail = |table: &str, e: idempotency_mysql::Error| OpsError::schema(table, e);
        let mut out = vec![entry(
            TableKind::Records,
            &records,
            strings(
                &store
                    .schema_problems()
                    .await
                    .map_err(|e| fail(&records, e))?,
            ),
        )];
        if let Some(outbox) = outbox {
            let table = outbox.table().to_string();
            let problems = outbox
                .schema_problems()
                .await
                .map_err(|e| OpsError::schema(&table, e))?;
            out.push(entry(TableKind::Outbox, &table, strings(&problems)));
        }
        if let Some(inbox) = inbox {
            let name = &inbox.table_name;
            let table = idempotency_mysql::TableName::parse(name).map_err(|e| fail(name, e))?;
            let problems = idempotency_mysql::MysqlInbox::with_table(self.clone(), table)
                .map_err(|e| OpsError::schema(name, e))?
                .schema_problems()
                .await
                .map_err(|e| OpsError::schema(name, e))?;
            out.push(entry(TableKind::Inbox, name, strings(&problems)));
        }
        Ok(out)
    }

    async fn create_inbox(&self, inbox: &InboxConfig) -> Result<(), OpsError> {
        let name = &inbox.table_name;
        let table =
            idempotency_mysql::TableName::parse(name).map_err(|e| OpsError::schema(name, e))?;
        idempotency_mysql::MysqlInbox::with_table(self.clone(), table)
            .map_err(|e| OpsError::schema(name, e))?
            .create_schema()
            .await
            .map_err(|e| OpsError::schema(name, e))
    }
}
