//! Database errors, classified by SQLSTATE and error kind, never by message text.

use crate::error::Error;

impl From<sqlx::Error> for Error {
    fn from(error: sqlx::Error) -> Self {
        let code = error
            .as_database_error()
            .and_then(|db| db.code())
            .map(|code| code.into_owned());
        match (&error, code.as_deref()) {
            // serialization_failure, deadlock_detected
            (_, Some("40001" | "40P01")) => Self::Conflict(Box::new(error)),
            // connection_exception class, admin/crash shutdown, cannot_connect_now
            (_, Some(code))
                if code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03") =>
            {
                Self::Unavailable(Box::new(error))
            }
            (
                sqlx::Error::Io(_)
                | sqlx::Error::Tls(_)
                | sqlx::Error::PoolTimedOut
                | sqlx::Error::PoolClosed
                | sqlx::Error::WorkerCrashed,
                _,
            ) => Self::Unavailable(Box::new(error)),
            _ => Self::Database(Box::new(error)),
        }
    }
}
