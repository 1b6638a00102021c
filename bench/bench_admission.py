"""Admission cost per pod: our mutate and validate against a pass-through review in the same run.

Run: .venv/bin/python -m bench.bench_admission [--pods N]
Prints microseconds per review and the ratio to the pass-through baseline (parse the AdmissionReview,
answer allowed with no patch), plus the peak memory of one batch.
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import jsonpatch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.harness.pods import inference_pod, review
from webhook.rules.mutate import mutate
from webhook.rules.review import parse_review, respond, username
from webhook.rules.validate import validate
from webhook.server.settings import settings_from

SETTINGS = settings_from({})
KEY = Ed25519PrivateKey.generate()
LIMIT = 8 * 1024 * 1024


def review_bytes(obj: dict[str, Any], i: int) -> bytes:
    return json.dumps(review("CREATE", obj, uid=f"uid-{i}", namespace="ml")).encode()


def passthrough(body: bytes) -> bytes:
    request = parse_review(body, LIMIT)
    return json.dumps(respond(request["uid"])).encode()


def do_mutate(body: bytes) -> bytes:
    request = parse_review(body, LIMIT)
    patch = mutate(request["object"], request["namespace"], SETTINGS.contract, KEY, lambda: "00000000-0000-4000")
    return json.dumps(respond(request["uid"], patch=patch)).encode()


def do_validate(body: bytes) -> bytes:
    request = parse_review(body, LIMIT)
    verdict = validate(request["operation"], request.get("oldObject"), request["object"], username(request),
                       request["namespace"], SETTINGS, KEY.public_key())
    return json.dumps(respond(request["uid"], allowed=verdict.allowed, message=verdict.message)).encode()


def stamped(body: bytes) -> bytes:
    """The review the validating webhook sees: the mutating webhook's patch already applied."""
    doc = json.loads(body)
    request = doc["request"]
    patch = mutate(request["object"], "ml", SETTINGS.contract, KEY, lambda: "00000000-0000-4000")
    request["object"] = jsonpatch.apply_patch(request["object"], patch)
    return json.dumps(doc).encode()


def measure(fn: Callable[[bytes], bytes], bodies: list[bytes]) -> tuple[float, float]:
    for body in bodies[:20]:
        fn(body)
    start = time.perf_counter()
    for body in bodies:
        fn(body)
    per = (time.perf_counter() - start) / len(bodies) * 1e6
    tracemalloc.start()
    for body in bodies[:100]:
        fn(body)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return per, peak / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=2000)
    args = parser.parse_args()
    creates = [review_bytes(inference_pod(i), i) for i in range(args.pods)]
    validated = [stamped(body) for body in creates]
    base, base_mem = measure(passthrough, creates)
    rows = [("pass-through (baseline)", base, base_mem),
            ("mutate: stamp + sign + env", *measure(do_mutate, creates)),
            ("validate: verify + rules", *measure(do_validate, validated))]
    print(f"{args.pods} GPU-share pods (3 containers + 1 init container each)")
    print(f"{'review':32} {'us/review':>10} {'x baseline':>10} {'peak KiB/100':>13}")
    for name, per, mem in rows:
        print(f"{name:32} {per:10.1f} {per / base:10.2f} {mem:13.1f}")


if __name__ == "__main__":
    main()
