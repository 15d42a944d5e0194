//! Logs and traces: the log lines always; the spans exported over OTLP (HTTP/protobuf) when the
//! standard variable `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`)
//! is set, and not at all otherwise.
//!
//! The exporter reads the other standard variables itself (`OTEL_EXPORTER_OTLP_HEADERS`,
//! `..._TIMEOUT`, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, the batch processor's
//! `OTEL_BSP_*`). `OTEL_SDK_DISABLED=true` and `OTEL_TRACES_EXPORTER=none` turn it off. Only
//! `http/protobuf` is built in (no gRPC stack in the demo): `OTEL_EXPORTER_OTLP_PROTOCOL` (or
//! `..._TRACES_PROTOCOL`) set to anything else, or `OTEL_TRACES_EXPORTER` to anything but
//! `otlp` or `none`, stops the start naming the variable.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The protocol the demo exports with.
const HTTP_PROTOBUF: &str = "http/protobuf";

/// A tracing set-up that cannot work as configured.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TelemetryError {
    /// A standard variable asks for something the demo does not have.
    #[error(
        "{variable}={value:?} is not supported by the demo (it exports OTLP over http/protobuf)"
    )]
    Unsupported {
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
    },
    /// The OTLP exporter could not be built (an invalid endpoint, header or timeout).
    #[error("the OTLP span exporter could not be built")]
    Exporter(#[source] opentelemetry_otlp::ExporterBuildError),
}

/// The installed tracing; [`shutdown`](Self::shutdown) flushes the spans not yet exported.
#[derive(Debug)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Exports what is left and stops the exporter (blocking: call it off the runtime).
    pub fn shutdown(self) {
        if let Some(provider) = self.provider
            && let Err(error) = provider.shutdown()
        {
            tracing::warn!(%error, "the OTLP exporter did not shut down cleanly");
        }
    }
}

/// Installs the global subscriber: log lines filtered by `RUST_LOG` (default
/// `info,sqlx=warn`), plus the OpenTelemetry layer when the environment asks for an exporter,
/// which records the `info` spans whatever `RUST_LOG` says (`RUST_LOG=warn` keeps the log
/// quiet, not the traces). On an error the log lines are installed all the same, so that the
/// caller can log it.
pub fn init() -> Result<Telemetry, TelemetryError> {
    use tracing_subscriber::Layer as _;

    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,sqlx=warn".into());
    let (provider, error) = match provider_from(|name| std::env::var(name).ok()) {
        Ok(provider) => (provider, None),
        Err(error) => (None, Some(error)),
    };
    let otel = provider.as_ref().map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("idempotency-demo"))
            .with_filter(tracing_subscriber::filter::LevelFilter::INFO)
    });
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_filter(filter))
        .with(otel)
        .init();
    match error {
        Some(error) => Err(error),
        None => Ok(Telemetry { provider }),
    }
}

/// The tracer provider the variables `env` reads ask for: `None` without an endpoint.
pub fn provider_from(
    env: impl Fn(&str) -> Option<String>,
) -> Result<Option<SdkTracerProvider>, TelemetryError> {
    let var = |name: &str| env(name).filter(|value| !value.trim().is_empty());
    if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    match var("OTEL_TRACES_EXPORTER").as_deref().map(str::trim) {
        None | Some("otlp") => {}
        Some("none") => return Ok(None),
        Some(other) => {
            return Err(TelemetryError::Unsupported {
                variable: "OTEL_TRACES_EXPORTER",
                value: other.to_owned(),
            });
        }
    }
    for variable in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Some(value) = var(variable)
            && value.trim() != HTTP_PROTOBUF
        {
            return Err(TelemetryError::Unsupported { variable, value });
        }
    }
    if var("OTEL_EXPORTER_OTLP_ENDPOINT").is_none()
        && var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_none()
    {
        return Ok(None);
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .build()
        .map_err(TelemetryError::Exporter)?;
    let mut resource = Resource::builder();
    if var("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("idempotency-demo");
    }
    Ok(Some(
        SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource.build())
            .build(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(pairs: &'a [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn without_an_endpoint_nothing_is_exported() {
        assert!(provider_from(vars(&[])).unwrap().is_none());
        assert!(
            provider_from(vars(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")]))
                .unwrap()
                .is_none()
        );
        let off = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ];
        assert!(provider_from(vars(&off)).unwrap().is_none());
    }

    #[test]
    fn what_the_demo_cannot_do_stops_it_naming_the_variable() {
        let grpc = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ];
        let error = provider_from(vars(&grpc)).unwrap_err();
        assert!(
            error.to_string().contains("OTEL_EXPORTER_OTLP_PROTOCOL"),
            "{error}"
        );
        let zipkin = [("OTEL_TRACES_EXPORTER", "zipkin")];
        let error = provider_from(vars(&zipkin)).unwrap_err();
        assert!(
            error.to_string().contains("OTEL_TRACES_EXPORTER"),
            "{error}"
        );
    }
}
