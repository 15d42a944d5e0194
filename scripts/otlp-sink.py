#!/usr/bin/env python3
"""A local OTLP/HTTP traces receiver for scripts/bench.sh: answers every POST /v1/traces with
an empty ExportTraceServiceResponse (200, application/x-protobuf) and counts what arrived, so
the bench's "tracing on" side pays for a real export over the loopback (the SDK's batch
processor, protobuf encoding, an HTTP round trip per batch) and says how many spans it sent.

    scripts/otlp-sink.py PORT COUNTS_FILE

On SIGTERM or SIGINT it writes `requests spans bytes` to COUNTS_FILE and exits. The spans are
counted by walking the protobuf: ExportTraceServiceRequest.resource_spans (1) ->
ResourceSpans.scope_spans (2) -> ScopeSpans.spans (2). Standard library only.
"""

import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def varint(data, i):
    shift = value = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i
        shift += 7


def fields(data):
    """(field number, bytes) of each length-delimited field; other wire types skipped."""
    i = 0
    while i < len(data):
        key, i = varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, i = varint(data, i)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        elif wire == 2:
            length, i = varint(data, i)
            yield number, data[i:i + length]
            i += length
        else:
            return


def count_spans(body):
    spans = 0
    for number, resource_spans in fields(body):
        if number != 1:
            continue
        for number, scope_spans in fields(resource_spans):
            if number != 2:
                continue
            spans += sum(1 for number, _ in fields(scope_spans) if number == 2)
    return spans


lock = threading.Lock()
totals = {"requests": 0, "spans": 0, "bytes": 0}


class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        try:
            spans = count_spans(body)
        except IndexError:
            spans = 0
        with lock:
            totals["requests"] += 1
            totals["spans"] += spans
            totals["bytes"] += len(body)
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def main():
    port, counts = int(sys.argv[1]), sys.argv[2]
    server = ThreadingHTTPServer(("127.0.0.1", port), Sink)

    def stop(*_):
        with lock:
            with open(counts, "w") as f:
                f.write(f"{totals['requests']} {totals['spans']} {totals['bytes']}\n")
        threading.Thread(target=server.shutdown).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.serve_forever()


if __name__ == "__main__":
    main()
