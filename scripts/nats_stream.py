"""A JetStream stream's message count, a message's subject, every message's headers, or the
stream deleted, through the NATS protocol on a socket (the CI machine has no `nats` CLI).
NATS_URL names the server (default nats://127.0.0.1:4222).

    python3 scripts/nats_stream.py count STREAM
    python3 scripts/nats_stream.py subject STREAM SEQ
    python3 scripts/nats_stream.py headers STREAM   # one JSON object a message: seq, subject, headers
    python3 scripts/nats_stream.py delete STREAM
"""
import base64
import json
import os
import socket
import sys
import urllib.parse


class Connection:
    """One connection, its requests answered one at a time on one inbox."""

    def __init__(self):
        url = urllib.parse.urlparse(os.environ.get("NATS_URL", "nats://127.0.0.1:4222"))
        self.socket = socket.create_connection((url.hostname or "127.0.0.1", url.port or 4222), timeout=5)
        self.file = self.socket.makefile("rb")
        self.file.readline()  # INFO
        self.socket.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\nSUB _INBOX.stream 1\r\n')

    def request(self, subject, payload=b""):
        self.socket.sendall(b"PUB %s _INBOX.stream %d\r\n%s\r\n" % (subject.encode(), len(payload), payload))
        while True:
            line = self.file.readline()
            if not line:
                raise SystemExit("NATS closed the connection")
            if line.startswith(b"PING"):
                self.socket.sendall(b"PONG\r\n")
            elif line.startswith(b"MSG"):
                data = self.file.read(int(line.split()[-1]))
                self.file.readline()  # the payload's CRLF
                return json.loads(data)
            elif line.startswith(b"-ERR"):
                raise SystemExit(line.decode())


def headers_of(encoded):
    """A stored message's headers (`NATS/1.0` then `Name: value` lines), as a dict."""
    lines = base64.b64decode(encoded or "").decode().split("\r\n")[1:]
    return dict(line.split(": ", 1) for line in lines if ": " in line)


def main():
    command, stream = sys.argv[1], sys.argv[2]
    nats = Connection()
    if command == "count":
        print(nats.request(f"$JS.API.STREAM.INFO.{stream}")["state"]["messages"])
    elif command == "subject":
        seq = int(sys.argv[3])
        answer = nats.request(f"$JS.API.STREAM.MSG.GET.{stream}", json.dumps({"seq": seq}).encode())
        print(answer["message"]["subject"])
    elif command == "headers":
        state = nats.request(f"$JS.API.STREAM.INFO.{stream}")["state"]
        for seq in range(state["first_seq"], state["last_seq"] + 1):
            answer = nats.request(f"$JS.API.STREAM.MSG.GET.{stream}", json.dumps({"seq": seq}).encode())
            if "message" not in answer:  # deleted
                continue
            message = answer["message"]
            print(json.dumps({"seq": seq, "subject": message["subject"], "headers": headers_of(message.get("hdrs"))}))
    elif command == "delete":
        print(nats.request(f"$JS.API.STREAM.DELETE.{stream}"))
    else:
        raise SystemExit(__doc__)


main()
