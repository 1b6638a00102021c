"""A claim source for the DRA driver's tests: claims in memory, reads counted, failures and hangs on demand."""

from __future__ import annotations

import threading
from typing import Any


class FakeClaims:
    def __init__(self, *claims: dict[str, Any]) -> None:
        self.claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in claims}
        self.reads = 0
        self.failure: Exception | None = None
        self.hang: threading.Event | None = None  # reads wait for it to be set

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        self.reads += 1
        if self.hang is not None:
            self.hang.wait()
        if self.failure is not None:
            raise self.failure
        return self.claims[namespace, name]
