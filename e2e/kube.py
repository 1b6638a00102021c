"""The tier's two ways to the API server: a small JSON REST client and the real kubectl."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class KubeError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class Rest:
    """JSON over HTTPS with a bearer token or a client certificate; every request is bounded in time."""

    def __init__(self, server: str, ca: Path, *, token: str | None = None,
                 client: tuple[Path, Path] | None = None, timeout: float = 10.0) -> None:
        self.server = server.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.context = ssl.create_default_context(cafile=str(ca))
        if client is not None:
            self.context.load_cert_chain(str(client[0]), str(client[1]))

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.server + path, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", content_type)
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self.context) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")
            try:
                message = json.loads(text).get("message", text)
            except ValueError:
                message = text
            raise KubeError(exc.code, message) from None

    def get(self, path: str) -> Any:
        return self.call("GET", path)


def kubectl_path() -> str:
    found = shutil.which("kubectl")
    if found is None:
        raise FileNotFoundError("kubectl is not on PATH; ./dev e2e installs it into the virtual environment")
    return found


class Kubectl:
    """The real kubectl with one kubeconfig; `run` returns (exit status, stdout, stderr) and never raises."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.binary = kubectl_path()

    def run(self, args: Sequence[str], stdin: str | None = None, timeout: float = 60.0) -> tuple[int, str, str]:
        result = subprocess.run(
            [self.binary, "--kubeconfig", str(self.kubeconfig), *args], input=stdin, capture_output=True,
            text=True, timeout=timeout, check=False,
        )
        return result.returncode, result.stdout, result.stderr

    def ok(self, args: Sequence[str], stdin: str | None = None, timeout: float = 60.0) -> str:
        code, out, err = self.run(args, stdin, timeout)
        if code != 0:
            raise KubeError(code, f"kubectl {' '.join(args)} failed: {err.strip() or out.strip()}")
        return out

    def json(self, args: Sequence[str]) -> Any:
        return json.loads(self.ok([*args, "-o", "json"]))
