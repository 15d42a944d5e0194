//! [`BrokerHealth`]: what a publisher knows of its broker, for health endpoints.

use std::fmt;

/// Whether a publisher's broker can be reached now ([`Publisher::health`](super::Publisher::health)).
///
/// ```
/// use idempotency_outbox::publisher::BrokerHealth;
///
/// assert!(BrokerHealth::Up.is_up());
/// assert!(!BrokerHealth::Down("connection refused".into()).is_up());
/// assert_eq!(BrokerHealth::Unknown.to_string(), "unknown");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BrokerHealth {
    /// Connected, and the broker answered.
    Up,
    /// Not connected, or the broker did not answer: why, for the operator.
    Down(String),
    /// The publisher cannot tell (the default of [`Publisher::health`](super::Publisher::health)).
    Unknown,
}

impl BrokerHealth {
    /// Whether the broker is known to answer.
    pub fn is_up(&self) -> bool {
        matches!(self, Self::Up)
    }
}

impl fmt::Display for BrokerHealth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Up => f.write_str("up"),
            Self::Down(reason) => write!(f, "down: {reason}"),
            Self::Unknown => f.write_str("unknown"),
        }
    }
}
