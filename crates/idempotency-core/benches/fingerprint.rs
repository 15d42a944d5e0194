//! Fingerprint cost for a 200-byte, a 4 KiB and a 64 KiB request.
//!
//! `cargo bench -p idempotency-core --bench fingerprint`

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use idempotency_core::{FingerprintStrategy, HashAlgorithm, JcsFingerprint};
use serde_json::{Value, json};

/// A payment-like request padded with line items until its compact JSON reaches `target` bytes.
fn request(target: usize) -> Value {
    let mut items = Vec::new();
    let mut value = json!({"orderId": "o-1", "recipient": "alice", "amount": 100.25, "items": []});
    let mut i = 0u64;
    while serde_json::to_string(&value).map(|s| s.len()).unwrap_or(0) < target {
        items.push(json!({"sku": format!("sku-{i}"), "qty": i % 7 + 1, "price": 1999 + i}));
        value["items"] = Value::Array(items.clone());
        i += 1;
    }
    value
}

fn fingerprint(c: &mut Criterion) {
    let mut group = c.benchmark_group("fingerprint");
    for (label, size) in [("200B", 200), ("4KiB", 4 * 1024), ("64KiB", 64 * 1024)] {
        let value = request(size);
        let bytes = serde_json::to_string(&value)
            .map(|s| s.len())
            .unwrap_or(size);
        group.throughput(Throughput::Bytes(bytes as u64));
        for algorithm in [HashAlgorithm::Sha256, HashAlgorithm::Sha512] {
            let strategy = JcsFingerprint::new(algorithm);
            group.bench_with_input(
                BenchmarkId::new(format!("{algorithm:?}"), label),
                &value,
                |b, value| b.iter(|| strategy.fingerprint(std::hint::black_box(value))),
            );
        }
        group.bench_with_input(
            BenchmarkId::new("canonicalize-only", label),
            &value,
            |b, value| {
                b.iter(|| idempotency_core::fingerprint::canonicalize(std::hint::black_box(value)));
            },
        );
    }
    group.finish();
}

criterion_group!(benches, fingerprint);
criterion_main!(benches);
