"""The API server, seen by `kubectl gpushare`: kubeconfig loading as kubectl does it, and four list calls.

The only module of the plugin that imports the `kubernetes` client. Every failure becomes a ClusterError whose
text is one line saying what failed and what to do.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubectlplugin.impersonation import Identity, impersonate

_CONNECTION_PREFIX = re.compile(r"^(<[^>]*>|HTTPS?Connection\([^)]*\)): ")
_SSL_SOURCE = re.compile(r" \(_ssl\.c:[0-9]+\)")
PAGE = 500  # items per list request; large clusters are read in pages (the API server's `limit`/`continue`)


class ClusterError(Exception):
    """The cluster could not be read; the text is the one line the user sees, `status` the HTTP status if any."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Access:
    """Where and as whom to connect, as kubectl decides it: --kubeconfig, else $KUBECONFIG (a list of files
    separated by ':'), else ~/.kube/config, else the pod's ServiceAccount when running inside a cluster; `identity`
    is whom to act as (--as, --as-group)."""

    kubeconfig: str = ""
    env_kubeconfig: str = ""
    home: str = ""
    context: str = ""
    timeout: float = 10.0
    identity: Identity = field(default_factory=Identity)


@dataclass(frozen=True)
class Snapshot:
    server: str
    nodes: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    events: list[dict[str, Any]]
    claims: list[dict[str, Any]] = field(default_factory=list)  # ResourceClaims (resource.k8s.io/v1)
    notes: tuple[str, ...] = ()  # what could not be read, said under the table


def kubeconfig_files(access: Access) -> list[str]:
    """The kubeconfig files kubectl would read, in order; an explicit --kubeconfig must exist."""
    if access.kubeconfig:
        if not os.path.isfile(access.kubeconfig):
            raise ClusterError(f"the kubeconfig {access.kubeconfig} given by --kubeconfig does not exist; "
                               "pass the path of an existing kubeconfig file")
        return [access.kubeconfig]
    if access.env_kubeconfig:
        listed = [os.path.expanduser(p) for p in access.env_kubeconfig.split(os.pathsep) if p]
        found = [p for p in listed if os.path.isfile(p)]
        if not found:
            raise ClusterError(f"none of the kubeconfig files in KUBECONFIG ({access.env_kubeconfig}) exists; "
                               "set KUBECONFIG to existing files or pass --kubeconfig")
        return found
    default = os.path.join(access.home, ".kube", "config") if access.home else ""
    return [default] if default and os.path.isfile(default) else []


def contexts(files: Sequence[str]) -> tuple[str, list[str]]:
    """(current context, every context name) of the merged files: kubectl takes the current-context of the first
    file that sets one (client-go's merge rules)."""
    import yaml

    current, names = "", []
    for path in files:
        try:
            with open(path, encoding="utf-8") as handle:
                doc = yaml.safe_load(handle)
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise ClusterError(f"the kubeconfig {path} could not be read ({_short(exc)}); fix the file or pass "
                               "another with --kubeconfig") from exc
        if not isinstance(doc, dict):
            raise ClusterError(f"the kubeconfig {path} is not a kubeconfig (a YAML mapping); fix the file or pass "
                               "another with --kubeconfig")
        current = current or str(doc.get("current-context") or "")
        names += [str(c.get("name")) for c in doc.get("contexts") or [] if isinstance(c, dict)]
    return current, names


def configuration(access: Access) -> Any:
    """A kubernetes.client.Configuration for the chosen kubeconfig and context (or the in-cluster identity)."""
    from kubernetes import client, config

    settings = client.Configuration()
    files = kubeconfig_files(access)
    if not files:
        try:
            config.load_incluster_config(client_configuration=settings)  # type: ignore[no-untyped-call]
        except config.ConfigException as exc:
            raise ClusterError(
                f"no kubeconfig was found (no --kubeconfig, no KUBECONFIG, no {access.home or '~'}/.kube/config) "
                "and this is not a pod in a cluster; pass --kubeconfig or set KUBECONFIG"
            ) from exc
        return settings
    current, names = contexts(files)
    context = access.context or current
    where = os.pathsep.join(files)
    if not context:
        raise ClusterError(f"the kubeconfig {where} sets no current-context; pass --context NAME")
    if context not in names:
        raise ClusterError(f"the kubeconfig {where} has no context {context!r} (it has {', '.join(names) or 'none'}); "
                           "pass one of them with --context")
    try:
        with _logged_errors() as errors:
            config.load_kube_config(config_file=where, context=context,  # type: ignore[no-untyped-call]
                                    client_configuration=settings, persist_config=False)
    except Exception as exc:  # ConfigException, YAML, base64 and certificate errors: all mean a broken kubeconfig
        raise ClusterError(f"the kubeconfig {where} could not be used with context {context!r} ({_short(exc)}); "
                           "fix its cluster and user entries") from exc
    if errors:  # the client logs a failed exec credential plugin and goes on without credentials
        raise ClusterError(f"the user of context {context!r} in the kubeconfig {where} got no credentials "
                           f"({_one_line(errors[-1])}); fix its exec command or log in again")
    if not str(settings.host or "").startswith(("https://", "http://")):
        raise ClusterError(f"the cluster of context {context!r} in the kubeconfig {where} has no server address "
                           f"({settings.host!r}); set its server, such as https://host:6443")
    # One attempt per request: urllib3's retries would log a warning per retry and hide the first error's cause.
    settings.retries = 0
    return settings


@contextlib.contextmanager
def _logged_errors() -> Iterator[list[str]]:
    """What the kubernetes client logs at ERROR on the root logger meanwhile, captured instead of printed."""
    captured: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            captured.append(record.getMessage())

    root = logging.getLogger()
    handler = Capture(logging.ERROR)
    saved = root.handlers[:]
    root.handlers = [handler]
    try:
        yield captured
    finally:
        root.handlers = saved


def read(access: Access, namespace: str | None, selector: str = "") -> Snapshot:
    """Nodes, and the pods and Events of one namespace (None: every namespace); `selector`, a label selector the API
    server applies to the pods (-l)."""
    from kubernetes import client

    settings = configuration(access)
    with client.ApiClient(settings) as api_client:
        impersonate(api_client, access.identity)
        core = client.CoreV1Api(api_client)
        server = str(settings.host)
        where = f"namespace {namespace}" if namespace else "all namespaces"
        nodes = _list(access, server, "list nodes", core.list_node)
        matching = {"label_selector": selector} if selector else {}
        pods_in = f"list pods matching {selector!r} in {where}" if selector else f"list pods in {where}"
        if namespace:
            pods = _list(access, server, pods_in, core.list_namespaced_pod, namespace, **matching)
            events = _list(access, server, f"list events in {where}", core.list_namespaced_event, namespace)
        else:
            pods = _list(access, server, pods_in, core.list_pod_for_all_namespaces, **matching)
            events = _list(access, server, f"list events in {where}", core.list_event_for_all_namespaces)
        claims, notes = _claims(access, server, client.ResourceV1Api(api_client), namespace, where)
    return Snapshot(server, nodes, pods, events, claims, notes)


def _claims(access: Access, server: str, api: Any, namespace: str | None, where: str
            ) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
    """The ResourceClaims (DRA shares), or none and a note saying why: a cluster without resource.k8s.io/v1, or a
    user who may not list claims, still sees the device-plugin shares."""
    what = f"list ResourceClaims in {where}"
    try:
        if namespace:
            return _list(access, server, what, api.list_namespaced_resource_claim, namespace), ()
        return _list(access, server, what, api.list_resource_claim_for_all_namespaces), ()
    except ClusterError as exc:
        if exc.status == 404:  # resource.k8s.io/v1 is not served: no claim can hold GPU memory
            return [], ()
        return [], (f"DRA shares not shown: {exc}",)


def _list(access: Access, server: str, what: str, method: Any, *args: Any, **query: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    token = ""
    while True:
        more = {"_continue": token} if token else {}
        page = _call(access, server, what, method, *args, limit=PAGE, **query, **more)
        items += page.get("items") or []
        token = str((page.get("metadata") or {}).get("continue") or "")
        if not token:
            return items


def _call(access: Access, server: str, what: str, method: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    from kubernetes.client.exceptions import ApiException

    try:
        response = method(*args, _preload_content=False, _request_timeout=access.timeout, **kwargs)
        doc = json.loads(response.data)
    except ApiException as exc:
        raise ClusterError(_refused(exc, server, what, access.identity), exc.status) from exc
    except ValueError as exc:
        raise ClusterError(f"the API server at {server} answered the request to {what} with something that is not "
                           "JSON; check that the kubeconfig points at a Kubernetes API server") from exc
    except Exception as exc:  # urllib3 and ssl errors have no common base worth naming
        raise ClusterError(_unreachable(exc, server, access.timeout)) from exc
    if not isinstance(doc, dict):
        raise ClusterError(f"the API server at {server} answered the request to {what} with no list; check that "
                           "the kubeconfig points at a Kubernetes API server")
    return doc


def _status_message(exc: Any) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or "")
    except (ValueError, AttributeError):
        return str(exc.body or "")[:200]


def _refused(exc: Any, server: str, what: str, identity: Identity) -> str:
    message = _status_message(exc)
    if exc.status == 401:
        return (f"the API server at {server} did not accept your credentials (401 Unauthorized); log in again or "
                "fix the user of your kubeconfig context")
    if exc.status == 403 and identity.user and "cannot impersonate" in message:
        return (f"you may not act as {identity.user} (403 Forbidden: {_one_line(message)}); ask for a role that may "
                "impersonate that user and those groups, or run without --as")
    if exc.status == 400 and what.startswith("list pods matching "):  # the server parses it (apimachinery labels)
        return (f"the API server at {server} rejected the label selector of the request to {what} (400 Bad Request: "
                f"{_one_line(message)}); fix -l/--selector, such as app=train or 'tier in (a,b)'")
    if exc.status == 403:
        hint = ("ask for a role that may list resourceclaims of resource.k8s.io (the view ClusterRole)"
                if "ResourceClaims" in what else
                "ask for a role that may list nodes, pods and events (the view ClusterRole and list on nodes)")
        if "all namespaces" in what:
            hint += ", or run with -n NAMESPACE for one namespace you may read"
        return f"you may not {what} (403 Forbidden: {_one_line(message)}); {hint}"
    return (f"the API server at {server} refused to {what} (HTTP {exc.status} {exc.reason}: {_one_line(message)}); "
            "try again, and check the API server's health if it persists")


def _unreachable(exc: Exception, server: str, timeout: float) -> str:
    text = _short(exc)
    lowered = text.lower()
    if "certificate" in lowered or "ssl" in lowered:
        return (f"the API server at {server} could not be verified over TLS ({text}); check the cluster's "
                "certificate-authority in your kubeconfig")
    if "timed out" in lowered or "timeout" in lowered:
        return (f"the API server at {server} did not answer within {timeout:g} s; check that the cluster is running "
                "and reachable, or raise --request-timeout")
    return (f"the API server at {server} could not be reached ({text}); check that the cluster is running and that "
            "your kubeconfig's server address is right")


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]


def _short(exc: BaseException) -> str:
    """The innermost reason of a urllib3/ssl/config error, on one line."""
    inner: object = exc
    while isinstance(getattr(inner, "reason", None), BaseException):
        inner = getattr(inner, "reason")  # noqa: B009 (urllib3's MaxRetryError -> NewConnectionError -> ...)
    text = str(inner) or type(inner).__name__
    # urllib3 prefixes connection errors with the connection: "<...HTTPSConnection ...>: " or "HTTPSConnection(...): ".
    return _one_line(_SSL_SOURCE.sub("", _CONNECTION_PREFIX.sub("", text)))
