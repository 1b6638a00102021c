"""`--as` and `--as-group`: every request to the API server names the user and groups to act as, as kubectl does.

client-go writes one `Impersonate-User` header and one `Impersonate-Group` header per group
(k8s.io/client-go/transport/round_trippers.go, impersonatingRoundTripper), and the API server reads every value of
the latter (k8s.io/apiserver/pkg/endpoints/filters/impersonation.go). The kubernetes client keeps its default headers
in a dict, one value per name, so the headers are added where the request leaves: the client's urllib3 pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

USER_HEADER = "Impersonate-User"
GROUP_HEADER = "Impersonate-Group"


@dataclass(frozen=True)
class Identity:
    """Whom to act as; an empty user means the kubeconfig's own identity."""

    user: str = ""
    groups: tuple[str, ...] = ()

    def headers(self) -> list[tuple[str, str]]:
        if not self.user:
            return []
        return [(USER_HEADER, self.user), *((GROUP_HEADER, group) for group in self.groups)]


class _Pool:
    """The client's pool manager, adding the impersonation headers to each request; everything else is the pool's."""

    def __init__(self, pool: Any, headers: Sequence[tuple[str, str]]) -> None:
        self._pool = pool
        self._headers = tuple(headers)

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        from urllib3 import HTTPHeaderDict

        headers = HTTPHeaderDict(kwargs.pop("headers", None) or {})
        for name, value in self._headers:
            headers.add(name, value)  # HTTPHeaderDict sends each value added as a header line of its own
        return self._pool.request(method, url, *args, headers=headers, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)


def impersonate(api_client: Any, identity: Identity) -> None:
    """Make every request of `api_client` (a kubernetes.client.ApiClient) act as `identity`."""
    headers = identity.headers()
    if headers:
        rest = api_client.rest_client
        rest.pool_manager = _Pool(rest.pool_manager, headers)
