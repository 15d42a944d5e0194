//! Requests, responses and their validation. Money is `rust_decimal::Decimal`, never a float,
//! and always carries two decimal places once validated.

use std::fmt;
use std::str::FromStr;

use rust_decimal::Decimal;
use serde::de::{self, IntoDeserializer, Unexpected, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use utoipa::ToSchema;
use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Schema, Type};
use uuid::Uuid;

use crate::problem::{ApiProblem, invalid};

/// Largest amount accepted, in currency units.
const MAX_AMOUNT: Decimal = Decimal::from_parts(100_000_000, 0, 0, false, 2); // 1,000,000.00
/// Largest charge accepted, in cents.
const MAX_CENTS: i64 = 100_000_000;

fn amount(field: &'static str, value: Decimal) -> Result<Decimal, ApiProblem> {
    if value <= Decimal::ZERO {
        return Err(invalid(field, "must be positive"));
    }
    if value > MAX_AMOUNT {
        return Err(invalid(field, "must be at most 1000000.00"));
    }
    if value.normalize().scale() > 2 {
        return Err(invalid(field, "must have at most two decimal places"));
    }
    let mut value = value;
    value.rescale(2);
    Ok(value)
}

/// The pattern of an amount sent as a JSON string, as the OpenAPI document gives it.
const AMOUNT_PATTERN: &str = r"^[0-9]{1,7}(\.[0-9]{1,2})?$";

/// Whether `text` matches [`AMOUNT_PATTERN`]: one to seven digits, then at most two decimals.
fn is_amount_text(text: &str) -> bool {
    let digits = |part: &str, max: usize| {
        (1..=max).contains(&part.len()) && part.bytes().all(|b| b.is_ascii_digit())
    };
    match text.split_once('.') {
        Some((whole, fraction)) => digits(whole, 7) && digits(fraction, 2),
        None => digits(text, 7),
    }
}

/// Reads an amount as the OpenAPI document describes it: a JSON string matching
/// [`AMOUNT_PATTERN`], or a JSON number (read as `Decimal` reads it). Any other string (`"1e2"`,
/// `"+5"`, `"1_000"`, which `Decimal` alone would take) is refused, so the document and the
/// service accept the same bodies.
fn deserialize_amount<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Decimal, D::Error> {
    struct Amount;

    impl<'de> Visitor<'de> for Amount {
        type Value = Decimal;

        fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
            formatter.write_str(
                "an amount: a JSON number, or a string of one to seven digits with at most \
                 two decimals such as \"25.00\"",
            )
        }

        fn visit_str<E: de::Error>(self, value: &str) -> Result<Decimal, E> {
            if !is_amount_text(value) {
                return Err(E::invalid_value(Unexpected::Str(value), &self));
            }
            Decimal::from_str(value).map_err(|_| E::invalid_value(Unexpected::Str(value), &self))
        }

        fn visit_i64<E: de::Error>(self, value: i64) -> Result<Decimal, E> {
            <Decimal as Deserialize>::deserialize(value.into_deserializer())
        }

        fn visit_u64<E: de::Error>(self, value: u64) -> Result<Decimal, E> {
            <Decimal as Deserialize>::deserialize(value.into_deserializer())
        }

        fn visit_f64<E: de::Error>(self, value: f64) -> Result<Decimal, E> {
            <Decimal as Deserialize>::deserialize(value.into_deserializer())
        }
    }

    deserializer.deserialize_any(Amount)
}

/// The OpenAPI schema of an amount: what [`deserialize_amount`] reads. The number form's
/// bounds are the validation's (positive, at most 1000000); its two decimals are checked by
/// the service, not the schema (`multipleOf: 0.01` is inexact in binary floating point).
fn amount_schema() -> Schema {
    let one_of = OneOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some(AMOUNT_PATTERN)),
        )
        .item(
            ObjectBuilder::new()
                .schema_type(Type::Number)
                .exclusive_minimum(Some(0))
                .maximum(Some(1_000_000)),
        )
        .description(Some(
            "How much: positive, at most two decimals, at most 1000000.00; a string (exact) \
             or a JSON number",
        ))
        .examples([serde_json::json!("25.00")])
        .build();
    Schema::OneOf(one_of)
}

fn text(field: &'static str, value: &str, max: usize) -> Result<(), ApiProblem> {
    if value.trim().is_empty() {
        return Err(invalid(field, "must not be empty"));
    }
    if value.chars().count() > max {
        return Err(invalid(field, "is too long"));
    }
    if value.chars().any(char::is_control) {
        return Err(invalid(field, "must not contain control characters"));
    }
    Ok(())
}

/// `POST /api/payments` body. The amount is a JSON number or string with at most two decimals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreatePayment {
    /// The order being paid.
    #[schema(min_length = 1, max_length = 64, example = "o-1")]
    pub order_id: String,
    /// Who is paid. `FAIL_ONCE` and `FAIL_TECH` simulate technical failures.
    #[schema(min_length = 1, max_length = 128, example = "alice")]
    pub recipient: String,
    /// How much: at most two decimals, positive, at most 1000000.00. A JSON number is accepted
    /// too; the string form is exact.
    #[schema(schema_with = amount_schema)]
    #[serde(deserialize_with = "deserialize_amount")]
    pub amount: Decimal,
}

impl CreatePayment {
    /// Checks the fields and normalizes the amount to two decimals, so that `100`, `100.0` and
    /// `"100.00"` are the same request (and the same fingerprint).
    pub fn validate(mut self) -> Result<Self, ApiProblem> {
        text("orderId", &self.order_id, 64)?;
        text("recipient", &self.recipient, 128)?;
        self.amount = amount("amount", self.amount)?;
        Ok(self)
    }
}

/// A confirmed payment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Payment {
    /// Its id (UUID v7).
    pub payment_id: Uuid,
    /// The order.
    pub order_id: String,
    /// The amount, as a string with two decimals.
    #[schema(value_type = String, example = "100.00")]
    pub amount: Decimal,
    /// Always `CONFIRMED`.
    pub status: String,
}

/// Details of an `INSUFFICIENT_FUNDS` rejection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct InsufficientFunds {
    /// The amount asked for.
    #[schema(value_type = String)]
    pub requested_amount: Decimal,
    /// The balance available.
    #[schema(value_type = String)]
    pub available_balance: Decimal,
}

/// `POST /api/refunds` body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateRefund {
    /// The payment refunded.
    #[schema(min_length = 1, max_length = 64)]
    pub payment_id: String,
    /// How much: at most two decimals, positive, at most 1000000.00 (string or number).
    #[schema(schema_with = amount_schema)]
    #[serde(deserialize_with = "deserialize_amount")]
    pub amount: Decimal,
}

impl CreateRefund {
    /// Checks the fields and normalizes the amount.
    pub fn validate(mut self) -> Result<Self, ApiProblem> {
        text("paymentId", &self.payment_id, 64)?;
        self.amount = amount("amount", self.amount)?;
        Ok(self)
    }
}

/// A refund.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Refund {
    /// Its id (UUID v7).
    pub refund_id: Uuid,
    /// The payment refunded.
    pub payment_id: String,
    /// The amount.
    #[schema(value_type = String, example = "300.00")]
    pub amount: Decimal,
    /// Always `REFUNDED`.
    pub status: String,
}

/// Details of a `REFUND_LIMIT_EXCEEDED` rejection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RefundLimit {
    /// The amount asked for.
    #[schema(value_type = String)]
    pub requested_amount: Decimal,
    /// The largest refund allowed.
    #[schema(value_type = String)]
    pub limit: Decimal,
}

/// `POST /charges` body (reference 000).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateCharge {
    /// The amount in cents: 1 to 100,000,000.
    #[schema(minimum = 1, maximum = 100000000, example = 4900)]
    pub amount_cents: i64,
}

impl CreateCharge {
    /// Checks the amount.
    pub fn validate(self) -> Result<Self, ApiProblem> {
        if !(1..=MAX_CENTS).contains(&self.amount_cents) {
            return Err(invalid("amountCents", "must be between 1 and 100000000"));
        }
        Ok(self)
    }
}

/// `POST /v2/accounts/{account}/deposits` body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateDeposit {
    /// How much: positive, at most two decimals, at most 1000000.00.
    #[schema(schema_with = amount_schema)]
    #[serde(deserialize_with = "deserialize_amount")]
    pub amount: Decimal,
}

impl CreateDeposit {
    /// Checks the account (from the path) and the amount, normalized to two decimals.
    pub fn validate(mut self, account: &str) -> Result<Self, ApiProblem> {
        text("account", account, 64)?;
        self.amount = amount("amount", self.amount)?;
        Ok(self)
    }
}

/// The query of `POST /v2/accounts/{account}/deposits`: `note` and nothing else (another
/// parameter, or `note` twice, is `400 invalid-request-query`).
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct DepositQuery {
    /// A note kept with the deposit.
    pub note: Option<String>,
}

/// The answer to `POST /v2/accounts/{account}/deposits`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Deposit {
    /// The deposit id (UUID v7).
    pub deposit_id: Uuid,
    /// The account, from the path.
    pub account: String,
    /// The amount, two decimals.
    #[schema(value_type = String, example = "25.00")]
    pub amount: Decimal,
    /// The note, from the query.
    pub note: Option<String>,
}

/// The answer to `POST /charges`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChargeCreated {
    /// The charge id (UUID v7).
    pub id: Uuid,
}

/// A stored charge, as `GET /charges/{id}` returns it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Charge {
    /// Its id.
    pub id: Uuid,
    /// The amount in cents.
    pub amount_cents: i64,
    /// When it was created (RFC 3339).
    pub created_at: String,
}

/// The outbox event written with each charge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChargeCreatedEvent {
    /// The charge.
    pub charge_id: Uuid,
    /// The amount in cents.
    pub amount_cents: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payment(amount: &str) -> Result<CreatePayment, ApiProblem> {
        serde_json::from_str::<CreatePayment>(&format!(
            r#"{{"orderId":"o-1","recipient":"alice","amount":{amount}}}"#
        ))
        .map_err(|_| invalid("amount", "unparsable"))?
        .validate()
    }

    #[test]
    fn equal_amounts_normalize_to_the_same_request() {
        let spellings = ["100", "100.0", "100.00", "\"100.00\"", "1e2"];
        let normalized: Vec<_> = spellings.iter().map(|s| payment(s).unwrap()).collect();
        assert!(normalized.windows(2).all(|w| w[0] == w[1]));
        assert_eq!(normalized[0].amount.to_string(), "100.00");
    }

    #[test]
    fn bad_amounts_are_refused() {
        for bad in ["0", "-1", "100.001", "1000000.01", "\"abc\""] {
            assert!(payment(bad).is_err(), "{bad}");
        }
        // Strings outside the documented pattern, though `Decimal` would read them.
        for bad in [
            "\"1e2\"",
            "\"+5\"",
            "\"1_000\"",
            "\" 5\"",
            "\"5.\"",
            "\".5\"",
            "\"12345678\"",
        ] {
            assert!(payment(bad).is_err(), "{bad}");
        }
        assert!(payment("\"1000000\"").is_ok());
        assert!(payment("\"0.5\"").is_ok());
        assert!(payment("1000000.00").is_ok());
    }
}
