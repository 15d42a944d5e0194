//! [`Report`]: `main`'s error, printed with its message and causes.

use std::fmt;

/// An error returned from `main` that prints as a message with its causes, not as a `Debug`
/// dump: `Error: idempotency.distributed-cache.url: is not set ...` rather than
/// `Error: Property { property: "...", .. }`. Any error converts into it with `?`.
///
/// ```no_run
/// #[tokio::main]
/// async fn main() -> Result<(), idempotency::Report> {
///     let settings = idempotency::Settings::load("config/orders.yaml")?;
///     # let _ = settings;
///     Ok(())
/// }
/// ```
pub struct Report(Box<dyn std::error::Error + Send + Sync + 'static>);

impl<E: std::error::Error + Send + Sync + 'static> From<E> for Report {
    fn from(error: E) -> Self {
        Self(Box::new(error))
    }
}

impl Report {
    /// The error.
    pub fn error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

impl fmt::Debug for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_prints_the_message_and_its_causes() {
        let error = crate::Error::Property {
            property: "idempotency.distributed-cache.url",
            reason: "is empty".to_owned(),
        };
        let report = Report::from(error);
        assert_eq!(
            format!("{report:?}"),
            "idempotency.distributed-cache.url: is empty"
        );
    }
}
