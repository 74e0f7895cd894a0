#!/usr/bin/env python3
"""A verifier service for the `http` verifier plugin that takes a fixed time per item, as a team's
sandboxed test runner or a judge model would: the CPU gap between a job's rollout and its update.

    slow_verifier.py --port-file FILE [--delay-ms MS]

Answers POST /verify with {"score", "passed"}: 1.0 when the last integer in the completion equals
reference.answer. Each request sleeps --delay-ms first (no CPU). Writes the port it listens on to
--port-file once it is ready. Standard library only.
"""

import argparse
import json
import os
import re
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    args = parser.parse_args()
    delay = args.delay_ms / 1000.0

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out in two writes: without this, Nagle's algorithm and the
        # client's delayed ACK add 40 ms to every answer.
        disable_nagle_algorithm = True

        def do_POST(self):
            item = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))) or b"{}")
            time.sleep(delay)
            numbers = re.findall(r"-?\d+", item.get("completion") or "")
            answer = str((item.get("reference") or {}).get("answer", ""))
            passed = bool(numbers) and numbers[-1] == answer
            body = json.dumps({"score": 1.0 if passed else 0.0, "passed": passed}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with open(args.port_file + ".tmp", "w") as out:
        out.write(str(server.server_address[1]))
    os.replace(args.port_file + ".tmp", args.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
