"""The reference scheduler extender, built from its own sources (e2e.toolchain), as the tier runs it.

The real kube-scheduler calls it with the users' `manifests/extender/scheduler-config.yaml` (filter and bind). It
reads only the environment: KUBECONFIG, PORT and LOG_LEVEL (cmd/main.go; its flags are ignored), and its identity
is the ServiceAccount of `manifests/extender/rbac.yaml`, in a kubeconfig file.

It listens on every interface (`http.ListenAndServe(":"+port)` in cmd/main.go), so it runs in a network namespace
of its own that holds only loopback (e2e.netns), with one forwarder across the boundary: the scheduler reaches it
on the host's 127.0.0.1 at the tier's extender port, and it reaches the API server on its own 127.0.0.1 at the
API server's port (the same number, so the server certificate's 127.0.0.1 still matches).
"""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

from e2e import netns
from e2e import settings as ports
from e2e.procs import Processes
from e2e.settings import E2eSettings
from e2e.toolchain import EXTENDER_BINARY

REPO = Path(__file__).resolve().parents[1]
NETNS = "gpushare-e2e-extender"
PORT = 12345  # the port of its own deployment (config/gpushare-schd-extender.yaml), inside its namespace
LOG_LEVEL = "info"  # its levels: debug (every pod dumped), info (every decision), warn, error


def environment(kubeconfig: Path) -> dict[str, str]:
    return {"KUBECONFIG": str(kubeconfig), "PORT": str(PORT), "LOG_LEVEL": LOG_LEVEL}


def forwarder_argv(settings: E2eSettings) -> list[str]:
    api = settings.port(ports.API_SERVER)
    return [sys.executable, "-m", "e2e.netns", "forward", NETNS,
            "--into", f"{settings.port(ports.EXTENDER)}:{PORT}", "--out", f"{api}:{api}"]


def url(settings: E2eSettings) -> str:
    """Where the scheduler (and the tests) reach it from the host."""
    return f"http://127.0.0.1:{settings.port(ports.EXTENDER)}/gpushare-scheduler"


def answers(settings: E2eSettings) -> bool:
    """It serves (it listens only once its pod, node and ConfigMap caches are in sync)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{settings.port(ports.EXTENDER)}/version", timeout=2) as answer:
        return bool(answer.status == 200)


def start(procs: Processes, settings: E2eSettings, reference: Path, kubeconfig: Path, env: dict[str, str]) -> None:
    """Its namespace, the forwarder, then the extender; ready once it answers through the forwarder."""
    netns.create(NETNS)
    forwarder = procs.start("extender-forwarder", forwarder_argv(settings), env=env, cwd=REPO)
    procs.wait_ready("extender-forwarder", lambda: "\nforwarding " in forwarder.log.read_text(errors="replace"), 30,
                     "forwarding")
    procs.start("extender", netns.exec_argv(NETNS, [str(reference / EXTENDER_BINARY)]),
                env={**env, **environment(kubeconfig)})
    procs.wait_ready("extender", lambda: answers(settings), 60, "answering /version")


def stop(procs: Processes) -> None:
    procs.stop("extender")
    procs.stop("extender-forwarder")
