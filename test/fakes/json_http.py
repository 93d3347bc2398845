"""What the stand-in servers share: a quiet request handler that answers with JSON, and the
``--port`` argument they are started with (sglang's launcher takes many more; they are ignored)."""

from __future__ import annotations

import argparse
import json
from http.server import BaseHTTPRequestHandler


class JsonHandler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def reply(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def read_json(self) -> dict:
        return json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")


def port_argument() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args, _ = parser.parse_known_args()
    return args.port
