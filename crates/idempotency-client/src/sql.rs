//! [`KeyStore`](crate::KeyStore)s on the project's SQL backends: `SqliteKeyStore` (feature
//! `sqlite`) and `PgKeyStore` (feature `postgres`), one row per operation in
//! `idempotency_client_keys`.

use crate::KeyStoreError;

/// The table of the SQL key stores.
pub const KEYS_TABLE: &str = "idempotency_client_keys";

/// Stores `fresh` unless the operation has a key, and returns the operation's key, in one
/// statement (two concurrent callers get the same key). `$n` parameters: both backends.
///
/// Each statement is unnamed and runs in a transaction of its own (in a task of its own: see
/// `spawned`), so that the stores work
/// behind PgBouncer in transaction pooling: there a session lasts one transaction, sqlx's
/// named statements collide, and an unnamed statement parsed outside a transaction may be
/// bound on another server connection. Two round trips more per call, small beside the HTTP
/// request the key is for.
const KEY_FOR: &str = "INSERT INTO idempotency_client_keys (operation, idempotency_key) VALUES ($1, $2) \
     ON CONFLICT (operation) DO UPDATE SET operation = excluded.operation RETURNING idempotency_key";
const FORGET: &str = "DELETE FROM idempotency_client_keys WHERE operation = $1";

fn failed(error: sqlx::Error) -> KeyStoreError {
    KeyStoreError(Box::new(error))
}

/// Runs `work` (a transaction from `BEGIN` to `COMMIT`) in a task of its own, so that it ends
/// whatever happens to the caller's future: dropped while `BEGIN` is answered, sqlx would hand
/// the connection back to the pool inside a transaction it does not know of (it counts the
/// transaction only once `BEGIN` is answered), and the next user's writes would go into it.
async fn spawned<T: Send + 'static>(
    work: impl Future<Output = Result<T, sqlx::Error>> + Send + 'static,
) -> Result<T, KeyStoreError> {
    use tracing::Instrument;
    match tokio::spawn(work.in_current_span()).await {
        Ok(result) => result.map_err(failed),
        Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
        Err(join) => Err(KeyStoreError(Box::new(join))),
    }
}

macro_rules! sql_key_store {
    ($(#[$doc:meta])* $name:ident, $pool:ty, $ddl:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $name {
            pool: $pool,
        }

        impl $name {
            /// A store on `pool`; the table must exist ([`create_table`](Self::create_table)).
            pub fn new(pool: $pool) -> Self {
                Self { pool }
            }

            /// Creates the keys table if it does not exist.
            ///
            /// # Errors
            ///
            /// The database's error.
            pub async fn create_table(&self) -> Result<(), KeyStoreError> {
                sqlx::raw_sql($ddl).execute(&self.pool).await.map_err(failed)?;
                Ok(())
            }
        }

        impl crate::KeyStore for $name {
            async fn key_for(&self, operation: &str, fresh: &str) -> Result<String, KeyStoreError> {
                let pool = self.pool.clone();
                let (operation, fresh) = (operation.to_owned(), fresh.to_owned());
                spawned(async move {
                    let mut tx = pool.begin().await?;
                    let key = sqlx::query_scalar(KEY_FOR)
                        .persistent(false)
                        .bind(&operation)
                        .bind(&fresh)
                        .fetch_one(&mut *tx)
                        .await?;
                    tx.commit().await?;
                    Ok(key)
                })
                .await
            }

            async fn forget(&self, operation: &str) -> Result<(), KeyStoreError> {
                let pool = self.pool.clone();
                let operation = operation.to_owned();
                spawned(async move {
                    let mut tx = pool.begin().await?;
                    sqlx::query(FORGET)
                        .persistent(false)
                        .bind(&operation)
                        .execute(&mut *tx)
                        .await?;
                    tx.commit().await
                })
                .await
            }
        }
    };
}

#[cfg(feature = "sqlite")]
sql_key_store!(
    /// Operation keys in a SQLite database: they survive a restart of the caller.
    ///
    /// ```
    /// use idempotency_client::{KeyStore, SqliteKeyStore};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// // one connection: each connection to `sqlite::memory:` is a database of its own
    /// let pool = sqlx::sqlite::SqlitePoolOptions::new()
    ///     .max_connections(1)
    ///     .connect("sqlite::memory:")
    ///     .await
    ///     .unwrap();
    /// let store = SqliteKeyStore::new(pool);
    /// store.create_table().await.unwrap();
    /// assert_eq!(store.key_for("job-7", "k-1").await.unwrap(), "k-1");
    /// assert_eq!(store.key_for("job-7", "k-2").await.unwrap(), "k-1");
    /// # });
    /// ```
    SqliteKeyStore,
    sqlx::SqlitePool,
    "CREATE TABLE IF NOT EXISTS idempotency_client_keys (\
     operation TEXT PRIMARY KEY, idempotency_key TEXT NOT NULL, \
     created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)"
);

#[cfg(feature = "postgres")]
sql_key_store!(
    /// Operation keys in a PostgreSQL database: they survive a restart of the caller.
    ///
    /// ```no_run
    /// use idempotency_client::{KeyStore, PgKeyStore};
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1/test").await?;
    /// let store = PgKeyStore::new(pool);
    /// store.create_table().await?;
    /// let key = store.key_for("job-7", "k-1").await?;
    /// # let _ = key;
    /// # Ok(())
    /// # }
    /// ```
    PgKeyStore,
    sqlx::PgPool,
    "CREATE TABLE IF NOT EXISTS idempotency_client_keys (\
     operation text PRIMARY KEY, idempotency_key text NOT NULL, \
     created_at timestamptz NOT NULL DEFAULT now())"
);
