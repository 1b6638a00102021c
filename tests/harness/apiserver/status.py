"""Kubernetes `Status` errors of the test API server, raised by its modules and by the sim client."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    500: "InternalError",
    504: "Timeout",
}


class ApiError(Exception):
    """An API failure carried as a `Status` object, exactly what the server sends and the client receives."""

    def __init__(
        self, code: int, message: str, reason: str | None = None, details: Obj | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or _REASONS.get(code, "Unknown")
        self.details = details

    def status(self) -> Obj:
        body: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body

    @classmethod
    def from_status(cls, body: Obj, fallback_code: int) -> ApiError:
        raw = body.get("code")
        code = raw if isinstance(raw, int) and raw else fallback_code
        return cls(code, str(body.get("message") or f"HTTP {fallback_code}"), body.get("reason"),
                   body.get("details"))

    def __repr__(self) -> str:
        return f"ApiError({self.code}, {self.reason}, {self.message!r})"


def _details(resource: str, name: str, group: str = "") -> Obj:
    details: Obj = {"name": name, "kind": resource}
    if group:
        details["group"] = group
    return details


def qualified(resource: str, group: str) -> str:
    return f"{resource}.{group}" if group else resource


def not_found(resource: str, name: str, group: str = "") -> ApiError:
    return ApiError(404, f'{qualified(resource, group)} "{name}" not found', "NotFound",
                    _details(resource, name, group))


def already_exists(resource: str, name: str, group: str = "") -> ApiError:
    return ApiError(409, f'{qualified(resource, group)} "{name}" already exists', "AlreadyExists",
                    _details(resource, name, group))


def conflict(resource: str, name: str, why: str, group: str = "") -> ApiError:
    return ApiError(
        409,
        f'Operation cannot be fulfilled on {qualified(resource, group)} "{name}": {why}',
        "Conflict",
        _details(resource, name, group),
    )


def stale(resource: str, name: str, group: str = "") -> ApiError:
    return conflict(resource, name, "the object has been modified; please apply your changes to the latest "
                    "version and try again", group)


def invalid(kind: str, name: str, message: str) -> ApiError:
    return ApiError(422, f'{kind} "{name}" is invalid: {message}', "Invalid", {"name": name, "kind": kind})


def bad_request(message: str) -> ApiError:
    return ApiError(400, message, "BadRequest")


def forbidden(message: str) -> ApiError:
    return ApiError(403, message, "Forbidden")


def internal(message: str) -> ApiError:
    return ApiError(500, f"Internal error occurred: {message}", "InternalError")


def gone(message: str) -> ApiError:
    return ApiError(410, message, "Expired")


def success(details: Obj | None = None, code: int = 200) -> Obj:
    body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": code}
    if details:
        body["details"] = details
    return body
