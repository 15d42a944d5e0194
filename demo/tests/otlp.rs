//! The demo exports its spans over OTLP when `OTEL_EXPORTER_OTLP_ENDPOINT` is set: the demo
//! binary runs against a real OTLP/HTTP receiver started here (an axum server decoding the
//! `opentelemetry-proto` protobuf the exporter sends), takes one payment, and the receiver gets
//! its `execute` span, with its store statements and cache calls, over the wire.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A received span: its name, trace id and string attributes.
#[derive(Debug, Clone)]
struct Received {
    name: String,
    trace_id: Vec<u8>,
    attributes: BTreeMap<String, String>,
    service: Option<String>,
}

type Inbox = Arc<Mutex<Vec<Received>>>;

async fn traces(State(inbox): State<Inbox>, body: Bytes) -> Vec<u8> {
    let request = ExportTraceServiceRequest::decode(body).unwrap();
    let mut inbox = inbox.lock().unwrap();
    for resource in request.resource_spans {
        let service = resource.resource.as_ref().and_then(|r| {
            r.attributes
                .iter()
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                    Value::StringValue(s) => Some(s.clone()),
                    _ => None,
                })
        });
        for scope in resource.scope_spans {
            for span in scope.spans {
                let attributes = span
                    .attributes
                    .iter()
                    .filter_map(|kv| match kv.value.as_ref()?.value.as_ref()? {
                        Value::StringValue(s) => Some((kv.key.clone(), s.clone())),
                        Value::IntValue(i) => Some((kv.key.clone(), i.to_string())),
                        Value::BoolValue(b) => Some((kv.key.clone(), b.to_string())),
                        _ => None,
                    })
                    .collect();
                inbox.push(Received {
                    name: span.name,
                    trace_id: span.trace_id,
                    attributes,
                    service: service.clone(),
                });
            }
        }
    }
    // An empty ExportTraceServiceResponse: everything accepted.
    Vec::new()
}

async fn receiver() -> (SocketAddr, Inbox) {
    let inbox = Inbox::default();
    let app = Router::new()
        .route("/v1/traces", post(traces))
        .with_state(inbox.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (address, inbox)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One HTTP/1.1 request on a fresh connection; the status line and the rest, or `None` when
/// nothing listens yet.
async fn http(port: u16, request: &str) -> Option<String> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.ok()?;
    Some(answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_exports_its_spans_to_the_otlp_endpoint() {
    let (receiver, inbox) = receiver().await;
    let port = free_port();
    let data = std::env::temp_dir().join(format!("otlp-demo-{}-{port}.db", std::process::id()));
    let mut demo = tokio::process::Command::new(env!("CARGO_BIN_EXE_idempotency-demo"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("DATABASE_URL")
        .env_remove("MYSQL_URL")
        .env_remove("REDIS_URL")
        .env_remove("NATS_URL")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL")
        .env_remove("OTEL_SERVICE_NAME")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{receiver}"))
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("SERVER__PORT", port.to_string())
        .env("DEMO__SQLITE_PATH", &data)
        .env("RUST_LOG", "info,sqlx=warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();

    let body = r#"{"orderId": "o-otlp", "recipient": "alice", "amount": 100.00}"#;
    let request = format!(
        "POST /api/payments HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Idempotency-Key: otlp-secret-key\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let started = Instant::now();
    let answer = loop {
        if let Some(answer) = http(port, &request).await {
            break answer;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the demo did not listen on {port}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");

    let execute = loop {
        let received = inbox.lock().unwrap().clone();
        if let Some(execute) = received.iter().find(|s| s.name == "idempotency.execute") {
            break (execute.clone(), received);
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no execute span arrived: {received:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (execute, received) = execute;
    let _ = demo.kill().await;
    let _ = std::fs::remove_file(&data);

    assert_eq!(execute.service.as_deref(), Some("idempotency-demo"));
    assert_eq!(execute.attributes["idempotency.outcome"], "executed");
    assert!(
        !execute
            .attributes
            .values()
            .any(|v| v.contains("otlp-secret-key"))
    );
    let statements: Vec<&str> = received
        .iter()
        .filter(|s| s.name == "idempotency.store" && s.trace_id == execute.trace_id)
        .map(|s| {
            assert_eq!(s.attributes["db.system"], "sqlite");
            s.attributes["db.statement.name"].as_str()
        })
        .collect();
    assert!(
        statements.contains(&"acquire") && statements.contains(&"complete"),
        "{statements:?}"
    );
}
