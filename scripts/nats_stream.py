"""A JetStream stream's message count, a message's subject, or the stream deleted, through the
NATS protocol on a socket (the CI machine has no `nats` CLI).

    python3 scripts/nats_stream.py count STREAM
    python3 scripts/nats_stream.py subject STREAM SEQ
    python3 scripts/nats_stream.py delete STREAM
"""
import json
import os
import socket
import sys
import urllib.parse


def request(subject, payload=b""):
    url = urllib.parse.urlparse(os.environ.get("NATS_URL", "nats://127.0.0.1:4222"))
    with socket.create_connection((url.hostname or "127.0.0.1", url.port or 4222), timeout=5) as s:
        f = s.makefile("rb")
        f.readline()  # INFO
        s.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\nSUB _INBOX.stream 1\r\n')
        s.sendall(b"PUB %s _INBOX.stream %d\r\n%s\r\n" % (subject.encode(), len(payload), payload))
        while True:
            line = f.readline()
            if not line:
                raise SystemExit("NATS closed the connection")
            if line.startswith(b"PING"):
                s.sendall(b"PONG\r\n")
            elif line.startswith(b"MSG"):
                data = f.read(int(line.split()[-1]))
                return json.loads(data)
            elif line.startswith(b"-ERR"):
                raise SystemExit(line.decode())


def main():
    command, stream = sys.argv[1], sys.argv[2]
    if command == "count":
        print(request(f"$JS.API.STREAM.INFO.{stream}")["state"]["messages"])
    elif command == "subject":
        seq = int(sys.argv[3])
        answer = request(f"$JS.API.STREAM.MSG.GET.{stream}", json.dumps({"seq": seq}).encode())
        print(answer["message"]["subject"])
    elif command == "delete":
        print(request(f"$JS.API.STREAM.DELETE.{stream}"))
    else:
        raise SystemExit(__doc__)


main()
