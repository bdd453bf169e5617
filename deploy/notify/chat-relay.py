#!/usr/bin/env python3
"""Relay drover's CloudEvents notifications to a chat's incoming webhook.

Slack, Mattermost and Rocket.Chat incoming webhooks take {"text": "..."};
drover posts CloudEvents (docs/install.md, "Notifications"). This relay
checks each notification's X-Drover-Signature (HMAC-SHA256 of the body with
the shared secret), turns it into one line of text and posts that line.
Python's standard library only.

    DROVER_NOTIFY_SECRET_FILE=/secrets/notify \
    CHAT_WEBHOOK_URL=https://hooks.slack.com/services/... \
    LISTEN=0.0.0.0:8080 python3 chat-relay.py
"""
import hashlib
import hmac
import json
import os
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer

SECRET = open(os.environ["DROVER_NOTIFY_SECRET_FILE"], "rb").read().rstrip(b"\r\n")
CHAT = os.environ["CHAT_WEBHOOK_URL"]
HOST, PORT = os.environ.get("LISTEN", "127.0.0.1:8080").rsplit(":", 1)
MAX_BODY = 64 * 1024


class Relay(BaseHTTPRequestHandler):
    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        if length > MAX_BODY:
            return self.send_error(413)
        body = self.rfile.read(length)
        want = "sha256=" + hmac.new(SECRET, body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(want, self.headers.get("X-Drover-Signature", "")):
            return self.send_error(401)
        event = json.loads(body)
        data = event.get("data", {})
        kind = event["type"].rsplit(".", 1)[-1]
        text = f"drover {data.get('env')}/{data.get('cluster')}: {kind}: {data.get('message')}"
        req = urllib.request.Request(
            CHAT,
            data=json.dumps({"text": text}).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            urllib.request.urlopen(req, timeout=10).read()
        except OSError:
            # drover retries with backoff: say the relay could not pass it on.
            return self.send_error(502)
        self.send_response(204)
        self.end_headers()


HTTPServer((HOST, int(PORT)), Relay).serve_forever()
