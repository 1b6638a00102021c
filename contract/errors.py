"""The contract's one error, and how its messages show a value from outside and read a JSON annotation."""

from __future__ import annotations

import json
from typing import Any


class ProtocolError(ValueError):
    """An annotation or resource value that breaks the contract; the text names the key and the fix."""


def shown(value: object, limit: int = 40) -> str:
    """A value for a message, cut short: a message must not repeat a 5000-digit number."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "... (" + str(len(str(value))) + " characters)"


def json_object(text: str, key: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except (TypeError, ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the parser goes
        raise ProtocolError(
            f"annotation {key} is not valid JSON ({str(exc)[:200]}); it is written by gpushare only"
        ) from exc
    if not isinstance(doc, dict):
        raise ProtocolError(f"annotation {key} must be a JSON object; it is written by gpushare only")
    return doc
