#!/usr/bin/env python3
"""The function server of `gsharectl up --runtime microvm` (stdlib only).

Every demo function's instance runs this in its own microVM (the agent's
`microvm` driver boots it as the guest's PID 1, see docs/microvm.md):

GET  /health -> 200 "ok" (the agent's readiness probe)
POST /invoke -> 200, the request body back (as the `sim` driver answers)

It does no GPU work: the guest has no GPU. The executor still orders and
delays requests by the function's latency profile; the answer's time is
this server's, through QEMU.
"""

import argparse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def log_message(self, fmt, *args):
        pass

    def _send(self, status, body, ctype):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self._send(200, b"ok", "text/plain")
        else:
            self._send(404, b"not found", "text/plain")

    def do_POST(self):
        if self.path != "/invoke":
            self._send(404, b"not found", "text/plain")
            return
        n = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(n)
        ctype = self.headers.get("Content-Type", "application/octet-stream")
        self._send(200, body, ctype)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    print("demo function listening on %s:%d" % (args.host, args.port), flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
