"""What the device plugin answers the kubelet with when it will not serve: a refusal of a pod (named, with its fix)
and the gRPC error it becomes."""

from __future__ import annotations


class Refusal(Exception):
    """The plugin will not serve these devices; the text names the pod and container and says what to do."""

    def __init__(self, message: str, reason: str = "GpuShareRefused") -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason


class PluginError(Exception):
    """An answer the kubelet receives as a gRPC error: `code` is a grpc.StatusCode name; `reason` is what the
    refusal is counted under (deviceplugin/metrics.py), `attributed` whether an Event on its pod says it already."""

    def __init__(self, code: str, message: str, reason: str = "", *, attributed: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason
        self.attributed = attributed
