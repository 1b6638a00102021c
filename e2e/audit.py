"""The scheduler extender's writes as the API server's audit log records them, and the answer each got.

The tier's API server records the extender's pod writes and bindings at level Request (e2e.control.audit_policy):
each event carries the user, the verb, the object, the request body and the response status. A pod UPDATE or
PATCH of a GPU-share pod matches the gpushare validating webhook (failurePolicy Fail; its matchConditions take
every pod with a GPU-memory limit), so the API server sends it there, and an HTTP 2xx answer means the webhook (and
every admission policy) allowed it; a denial carries the denier's message in the response status. A Binding goes to
the webhook only when it carries a reserved annotation (the extender's carry none): bindings are listed, marked as not
judged by it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Write:
    operation: str  # the admission operation: UPDATE for a pod update or patch, CREATE for a binding
    verb: str  # the HTTP-level verb the audit log names (update, patch, create)
    user: str
    pod: str  # namespace/name
    subresource: str
    keys: tuple[str, ...]  # annotation keys the request sets (a patch's keys; an update's reserved keys)
    code: int
    message: str  # the response status message (the denier's text when refused)

    @property
    def judged_by_webhook(self) -> bool:
        return self.subresource in ("", "status")

    @property
    def verdict(self) -> str:
        if 200 <= self.code < 300:
            return "allowed"
        return f"refused ({self.code}): {self.message}"

    def row(self) -> str:
        target = self.pod + (f"/{self.subresource}" if self.subresource else "")
        judged = "" if self.judged_by_webhook else " [not sent to the webhook]"
        return f"{self.operation:<6} {self.user} {target} keys={','.join(self.keys) or '-'} {self.verdict}{judged}"


_OPERATION = {"update": "UPDATE", "patch": "UPDATE", "create": "CREATE"}
RESERVED_PREFIXES = ("ALIYUN_COM_GPU_MEM_", "gpushare.io/")


def _keys(body: Any) -> tuple[str, ...]:
    annotations = ((body or {}).get("metadata") or {}).get("annotations") if isinstance(body, dict) else None
    if not isinstance(annotations, dict):
        return ()
    return tuple(sorted(k for k in annotations if k.startswith(RESERVED_PREFIXES)))


def parse(lines: Iterable[str], user: str) -> list[Write]:
    """The ResponseComplete events of `user`'s writes to pods, oldest first; other lines are skipped."""
    out = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict) or event.get("stage") != "ResponseComplete":
            continue
        if (event.get("user") or {}).get("username") != user:
            continue
        ref, status = event.get("objectRef") or {}, event.get("responseStatus") or {}
        verb = str(event.get("verb", ""))
        if ref.get("resource") not in ("pods", "bindings") or verb not in _OPERATION:
            continue
        subresource = str(ref.get("subresource", "") or ("binding" if ref.get("resource") == "bindings" else ""))
        out.append(Write(
            operation=_OPERATION[verb], verb=verb, user=user, pod=f"{ref.get('namespace')}/{ref.get('name')}",
            subresource=subresource, keys=_keys(event.get("requestObject")), code=int(status.get("code", 0)),
            message=str(status.get("message", "")),
        ))
    return out


def read(path: Path, user: str) -> list[Write]:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    return parse(text.splitlines(), user)
