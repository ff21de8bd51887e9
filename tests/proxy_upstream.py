#!/usr/bin/env python3
"""proxy_upstream.py PORTFILE - the app behind the proxy in tests/check_proxy.c.
proxy_upstream.py --env NAME - the same as a job's web port: listens on all
addresses at the port in the environment variable NAME (TRAINYARD_PORT_WEB;
bench/proxy/api_load.sh).

Standard library only. Listens on a free loopback port (written to PORTFILE
once listening) and answers, on any path prefix:
  .../echo        any method: JSON {method, path, headers (lower-case names),
                  lines (every header line as it came), body}
  .../file        GET/HEAD: 1 MiB of known bytes with a Content-Length
  .../chunked     a chunked body of 3 parts
  .../stream      chunked: "tick 0" at once, then one tick every 0.5 s, 6 in all (3 s)
  .../slowhead    the head after 3 s
  .../status/N    status N, empty body
  .../ws          a WebSocket echo (RFC 6455: text and binary frames come back
                  as they went, a ping gets its pong, a close its close)

proxy_upstream.py --standby PORTFILE LEADER LOG - a stand-in for a standby
server (tests/check_failover_client.c, until a real standby lands with the
database lease): every request is logged to LOG as a JSON line {method,
path, headers} and answered as docs/server.md says a standby answers: 503,
Retry-After: 1, X-Trainyard-Leader: LEADER and {"error": "standby",
"message", "leader": LEADER}; LEADER "none": no header and "leader": null.
GET /api/v1/health answers 200 {"role": "standby", "leader": ...}.
proxy_upstream.py --drop PORTFILE LOG - logs each request likewise, reads
its body and closes the connection without an answer (an answer lost).
"""
import base64
import hashlib
import json
import socketserver
import struct
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FILE = bytes((i * 7 + 3) % 251 for i in range(1 << 20))
WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def tail(self):
        return self.path.split("?")[0]

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def send(self, status, body, ctype="application/octet-stream", extra=()):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def any(self):
        t = self.tail()
        if t.endswith("/echo"):
            b = self.body()
            out = {"method": self.command, "path": self.path,
                   "headers": {k.lower(): v for k, v in self.headers.items()},
                   "lines": ["%s: %s" % (k, v) for k, v in self.headers.items()],  # every one, repeats too
                   "body": b.decode("latin-1")}
            self.send(200, json.dumps(out).encode(), "application/json", [("X-Upstream", "yes"), ("Keep-Alive", "timeout=5")])
        elif t.endswith("/file"):
            self.send(200, FILE, "application/octet-stream", [("ETag", '"f1"')])
        elif t.endswith("/chunked"):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (b"alpha-", b"beta-", b"gamma"):
                self.chunk(part)
            self.wfile.write(b"0\r\n\r\n")
        elif t.endswith("/stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(7):
                if i:
                    time.sleep(0.5)
                self.chunk(b"data: tick %d\n\n" % i)
            self.wfile.write(b"0\r\n\r\n")
        elif t.endswith("/slowhead"):
            time.sleep(3)
            self.send(200, b"late")
        elif "/status/" in t:
            self.send(int(t.rsplit("/", 1)[1]), b"")
        elif t.endswith("/ws") and self.headers.get("Upgrade", "").lower() == "websocket":
            self.websocket()
        else:
            self.send(404, b"no such thing\n", "text/plain")

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = any

    def websocket(self):
        key = self.headers["Sec-WebSocket-Key"]
        accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        r, w = self.rfile, self.wfile
        while True:
            h = r.read(2)
            if len(h) < 2:
                return
            op, n = h[0] & 0x0F, h[1] & 0x7F
            if n == 126:
                n = struct.unpack(">H", r.read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", r.read(8))[0]
            mask = r.read(4) if h[1] & 0x80 else b"\0\0\0\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(r.read(n)))
            if op == 9:
                op = 10
            out = bytes([0x80 | op])
            if len(data) < 126:
                out += bytes([len(data)])
            elif len(data) < 65536:
                out += bytes([126]) + struct.pack(">H", len(data))
            else:
                out += bytes([127]) + struct.pack(">Q", len(data))
            w.write(out + data)
            w.flush()
            if op == 8:
                return


class Standby(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    leader = None
    log = None
    drop = False

    def log_message(self, *args):
        pass

    def any(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        rec = {"method": self.command, "path": self.path,
               "headers": {k.lower(): v for k, v in self.headers.items()}}
        with open(self.log, "a") as f:
            f.write(json.dumps(rec) + "\n")
        if self.drop:
            self.close_connection = True
            return
        if self.command == "GET" and self.path.split("?")[0] == "/api/v1/health":
            body = json.dumps({"status": "ok", "role": "standby", "leader": self.leader}).encode()
            status, extra = 200, []
        else:
            msg = ("this server is a standby; the leader is %s" % self.leader if self.leader
                   else "this server is a standby; no leader: takeover expected within 7 s")
            body = json.dumps({"error": "standby", "message": msg, "leader": self.leader}).encode()
            status, extra = 503, [("Retry-After", "1")]
            if self.leader:
                extra.append(("X-Trainyard-Leader", self.leader))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = any


class Server(ThreadingHTTPServer):
    request_queue_size = 512
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # a client gone mid-answer (the proxy gave up on /slowhead): not news


def main():
    if sys.argv[1] == "--env":
        import os
        Server(("0.0.0.0", int(os.environ[sys.argv[2]])), Handler).serve_forever()
        return
    handler, portfile = Handler, sys.argv[1]
    if sys.argv[1] in ("--standby", "--drop"):
        Standby.drop = sys.argv[1] == "--drop"
        portfile = sys.argv[2]
        if Standby.drop:
            Standby.log = sys.argv[3]
        else:
            Standby.leader = None if sys.argv[3] == "none" else sys.argv[3]
            Standby.log = sys.argv[4]
        handler = Standby
    srv = Server(("127.0.0.1", 0), handler)
    with open(portfile + ".tmp", "w") as f:
        f.write(str(srv.server_address[1]))
    import os
    os.rename(portfile + ".tmp", portfile)
    srv.serve_forever()


if __name__ == "__main__":
    socketserver.TCPServer.allow_reuse_address = True
    main()
