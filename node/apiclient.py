"""The API-server client both node programs build on: credentials, requests bounded by the call they serve, errors.

The only module of node/ that imports the `kubernetes` client; each program's adapter (deviceplugin/apiserver.py,
dra/resourceapi.py) makes its requests through KubeClient.
"""

from __future__ import annotations

import json
import re
from typing import Any

from node import deadline


class ApiServerError(Exception):
    """The API server could not be reached or refused a request; the text says which and why."""


class Conflict(ApiServerError):
    """The object changed since it was read (HTTP 409): read it again and retry."""


class NotFound(ApiServerError):
    """The object does not exist (HTTP 404)."""


def describe(exc: BaseException) -> str:
    """An API client failure in a few words: urllib3 wraps the cause (MaxRetryError.reason) in long text."""
    status = getattr(exc, "status", None)
    if isinstance(status, int) and hasattr(exc, "body"):  # the client's ApiException: several lines with headers
        body = " ".join(str(getattr(exc, "body", "") or "").split())[:300]
        return f"HTTP {status} {getattr(exc, 'reason', '')}: {body}".rstrip(": ")
    reason = getattr(exc, "reason", None)
    if isinstance(reason, BaseException):
        exc = reason
    text = re.sub(r"^\w+\([^)]*\): ", "", str(exc))  # "HTTPSConnection(host='h', port=1): Failed to ..."
    return " ".join(text.split()) or type(exc).__name__


class KubeClient:
    """The kubernetes client of one process: in-cluster config, or a kubeconfig file (GPUSHARE_KUBECONFIG); every
    request bounded by `timeout` and by the deadline of the kubelet call it serves (node/deadline.py)."""

    def __init__(self, kubeconfig: str, timeout: float) -> None:
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException
        from yaml import YAMLError

        configuration = client.Configuration()
        try:
            if kubeconfig:
                config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
            else:
                config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except (ConfigException, OSError, ValueError, YAMLError) as exc:
            where = f"GPUSHARE_KUBECONFIG={kubeconfig}" if kubeconfig else "the in-cluster ServiceAccount"
            raise ApiServerError(
                f"{where} gives no API server credentials ({' '.join(str(exc).split())}); run the plugin in its "
                "DaemonSet with its ServiceAccount, or point GPUSHARE_KUBECONFIG at a kubeconfig file"
            ) from exc
        self.where = configuration.host
        self.client = client
        self.api_client = client.ApiClient(configuration)
        self.timeout = timeout

    def api(self, name: str, fix: str) -> Any:
        """The kubernetes client's API class `name` (CoreV1Api, ResourceV1Api) over this client; `fix` says what to
        install when this client version has none."""
        api = getattr(self.client, name, None)
        if api is None:
            raise ApiServerError(f"this kubernetes client has no {name}; {fix}")
        return api(self.api_client)

    def call(self, what: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        """`method` of an API class, bounded, its response unread; raises NotFound, Conflict or ApiServerError
        naming `what`."""
        from kubernetes.client.exceptions import ApiException

        timeout = deadline.left(self.timeout)
        if timeout <= 0:
            raise ApiServerError(f"could not {what}: the kubelet call it serves has run out of time")
        try:
            return method(*args, _preload_content=False, _request_timeout=timeout, **kwargs)
        except ApiException as exc:
            if exc.status == 404:
                raise NotFound(f"could not {what}: it does not exist (404 Not Found)") from exc
            if exc.status == 409:
                raise Conflict(f"could not {what}: it changed meanwhile (409 Conflict)") from exc
            raise ApiServerError(f"could not {what}: HTTP {exc.status} {exc.reason}: {(exc.body or '')[:300]}") from exc
        except Exception as exc:  # urllib3 and ssl errors have no common base worth naming
            raise ApiServerError(f"could not {what}: {describe(exc)}") from exc

    def send(self, what: str, method: Any, *args: Any, **kwargs: Any) -> None:
        """call() for a request whose answer is not needed (an Event, a status patch): the answer is read all the
        same. urllib3 gives a connection back to its pool only once its response was read to the end; one left
        unread is dropped, and the next request opens a new connection: a TCP and a TLS handshake with the API
        server each time."""
        self.call(what, method, *args, **kwargs).data  # noqa: B018 - reading it gives the connection back

    def read(self, what: str, method: Any, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        """The JSON answer of call(); None when the object does not exist."""
        try:
            response = self.call(what, method, *args, **kwargs)
        except NotFound:
            return None
        return json.loads(response.data)  # type: ignore[no-any-return]

    def close(self) -> None:
        self.api_client.close()  # type: ignore[no-untyped-call]
