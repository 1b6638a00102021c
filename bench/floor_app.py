"""What any signing mutate costs at least, served by the same worker and framework as the webhook (a benchmark app).

POST /mutate does only the work no implementation of the protocol can skip: read the body, parse it as JSON, sign
one intent with Ed25519 (DESIGN.md: the plugins trust only signed intents) and answer with an AdmissionReview as
large as the real one for the benchmarks' Deployment pod (tests/harness/pods.py). GET /healthz is the webhook's own.
bench/bench_webhook_http.py serves this app with gunicorn.conf.py to show how close /mutate can come to /healthz at all.
"""

from __future__ import annotations

import base64
import uuid
from typing import Any

import orjson
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flask import Flask, Response, request

from tests.harness.pods import create_review, deployment_pod
from webhook.rules.review import respond
from webhook.server.app import create_app
from webhook.server.settings import settings_from


def _real_answer_bytes() -> int:
    """The length of the real webhook's answer to the workload's review, measured with the real app."""
    settings = settings_from({})
    client = create_app(settings, private_key=Ed25519PrivateKey.generate()).test_client()
    return len(client.post("/mutate", data=create_review(deployment_pod())).get_data())


def create_floor_app() -> Flask:
    app = Flask(__name__)
    key = Ed25519PrivateKey.generate()
    size = _real_answer_bytes()
    # A patch of one op whose value pads the answer to the real answer's length (base64 grows it by 4/3).
    blank = len(orjson.dumps(respond("0" * 36, patch=[{"op": "add", "path": "/x", "value": ""}])))
    pad = "x" * max(0, (size - blank) * 3 // 4)

    @app.post("/mutate")
    def mutate() -> Any:
        doc = orjson.loads(request.get_data(cache=False))
        uid = doc["request"]["uid"]
        intent = orjson.dumps({"allocationId": str(uuid.uuid4()), "namespace": doc["request"]["namespace"]})
        signature = base64.b64encode(key.sign(intent)).decode()
        patch = [{"op": "add", "path": "/x", "value": pad[: len(pad) - len(signature)] + signature}]
        return Response(orjson.dumps(respond(uid, patch=patch)), 200, mimetype="application/json")

    @app.get("/healthz")
    def healthz() -> Any:
        return "ok\n", 200, {"Content-Type": "text/plain; charset=utf-8"}

    return app
