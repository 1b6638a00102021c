"""Kubeconfig files for one identity of the test API server (kubectl, the kubernetes client, sim actors)."""

from __future__ import annotations

import base64
import json
from pathlib import Path


def write_kubeconfig(path: Path, server: str, ca_pem: bytes, token: str, user_name: str = "sim-user") -> Path:
    """Write a kubeconfig (JSON is valid YAML) whose only context talks to `server` with bearer `token`."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "sim", "cluster": {
            "server": server, "certificate-authority-data": base64.b64encode(ca_pem).decode()}}],
        "users": [{"name": user_name, "user": {"token": token}}],
        "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": user_name, "namespace": "default"}}],
        "current-context": "sim",
        "preferences": {},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=2))
    path.chmod(0o600)
    return path
