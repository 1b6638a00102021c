"""e2e.netns: a namespace with only a loopback, and the forwarder across its boundary, both ways."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from e2e import netns, toolchain

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("text", "ports"), [("25100:39999", (25100, 39999)), ("1:65535", (1, 65535))])
def test_ports_are_two_tcp_ports(text: str, ports: tuple[int, int]) -> None:
    assert netns._ports(text) == ports


@pytest.mark.parametrize("text", ["25100", "0:80", "80:65536", "a:b", "80:80:80", ""])
def test_other_port_pairs_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="PORT:PORT"):
        netns._ports(text)


def test_exec_argv_runs_the_program_inside_the_namespace() -> None:
    assert netns.exec_argv("ext", ["/bin/x", "-v"]) == ["ip", "netns", "exec", "ext", "/bin/x", "-v"]


@pytest.mark.parametrize("name", ["", "../x", "a/b", "-n", "a b", "x" * 64])
def test_a_name_that_is_no_namespace_name_is_refused(name: str) -> None:
    with pytest.raises(netns.NetnsError, match="not a network namespace name"):
        netns.exec_argv(name, ["true"])


@pytest.fixture
def namespace() -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("ip") is None:
        pytest.skip("the ip command (iproute2) is not installed")
    name = f"gpushare-test-{os.getpid()}"
    try:
        netns.create(name)
    except netns.NetnsError as exc:
        pytest.skip(f"this machine cannot create a network namespace: {exc}")
    try:
        netns.create(name)  # idempotent
        yield name
    finally:
        netns.remove(name)
        netns.remove(name)
        assert not netns.path(name).exists()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def started(argv: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The process, in a process group of its own; stopped by its PID at the end."""
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def wait_for_line(log: Path, text: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return
        assert process.poll() is None, f"exited {process.returncode}: {log.read_text(errors='replace')}"
        time.sleep(0.05)
    raise AssertionError(f"no {text!r} in {log}: {log.read_text(errors='replace')}")


def forwarder(name: str, *routes: str) -> list[str]:
    return [sys.executable, "-m", "e2e.netns", "forward", name, *routes]


def stop(process: subprocess.Popen[bytes]) -> int:
    os.kill(process.pid, signal.SIGTERM)
    return process.wait(timeout=10)


def get(url: str, retry_for: float = 0.0) -> bytes:
    deadline = time.monotonic() + retry_for
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return bytes(response.read())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_into_the_namespace(namespace: str, tmp_path: Path) -> None:
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "hello.txt").write_text("inside")
    payload = os.urandom(4 << 20)  # many reads and writes of the forwarder's 64 KiB chunks
    (tmp_path / "www" / "payload").write_bytes(payload)
    host_port, ns_port = free_port(), free_port()
    server = netns.exec_argv(namespace, [sys.executable, "-u", "-m", "http.server", "--bind", "0.0.0.0", str(ns_port),
                                         "--directory", str(tmp_path / "www")])
    with started(server, tmp_path / "server.log"), \
            started(forwarder(namespace, "--into", f"{host_port}:{ns_port}"), tmp_path / "fwd.log") as fwd:
        wait_for_line(tmp_path / "fwd.log", "forwarding", fwd)
        assert get(f"http://127.0.0.1:{host_port}/hello.txt", retry_for=10) == b"inside"
        assert get(f"http://127.0.0.1:{host_port}/payload") == payload
        # The server listens on every interface of its namespace, and on none of the host's.
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", ns_port), timeout=2):
            pass
        assert stop(fwd) == 0
    log = (tmp_path / "fwd.log").read_text()
    assert log.splitlines()[0] == f"forwarding 127.0.0.1:{host_port} -> {namespace} 127.0.0.1:{ns_port}"


class Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"host {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_out_of_the_namespace_on_the_same_port(namespace: str, tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    client = netns.exec_argv(namespace, [
        sys.executable, "-c",
        f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{port}/x', timeout=5).read().decode())",
    ])
    try:
        with started(forwarder(namespace, "--out", f"{port}:{port}"), tmp_path / "fwd.log") as fwd:
            wait_for_line(tmp_path / "fwd.log", "forwarding", fwd)
            result = subprocess.run(client, capture_output=True, text=True, timeout=30, check=False)
            assert (result.returncode, result.stdout.strip()) == (0, "host /x"), result.stderr
            assert stop(fwd) == 0
    finally:
        server.shutdown()
        server.server_close()
    # Without the forwarder the namespace reaches nothing on the host.
    result = subprocess.run(client, capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode != 0 and "Connection refused" in result.stderr


def test_a_refused_connection_is_closed_and_logged_with_its_direction(namespace: str, tmp_path: Path) -> None:
    host_port, ns_port = free_port(), free_port()
    with started(forwarder(namespace, "--into", f"{host_port}:{ns_port}"), tmp_path / "fwd.log") as fwd:
        wait_for_line(tmp_path / "fwd.log", "forwarding", fwd)
        with socket.create_connection(("127.0.0.1", host_port), timeout=5) as sock:
            sock.settimeout(5)
            assert sock.recv(1) == b""  # nobody listens inside: the accepted connection is closed
        wait_for_line(tmp_path / "fwd.log", "cannot connect", fwd)
        assert stop(fwd) == 0
    failures = [line for line in (tmp_path / "fwd.log").read_text().splitlines() if "cannot connect" in line]
    assert len(failures) == 1
    assert f"into {namespace}: host 127.0.0.1:{host_port} -> namespace 127.0.0.1:{ns_port}" in failures[0]


def test_a_port_taken_inside_the_namespace_fails_the_forwarder_with_its_name(namespace: str, tmp_path: Path) -> None:
    port = free_port()
    holder = netns.exec_argv(namespace, [sys.executable, "-u", "-m", "http.server", "--bind", "127.0.0.1", str(port)])
    with started(holder, tmp_path / "holder.log") as held:
        wait_for_line(tmp_path / "holder.log", "Serving HTTP", held)
        result = subprocess.run(forwarder(namespace, "--out", f"{port}:{port}"), capture_output=True, text=True,
                                cwd=REPO, timeout=30, check=False)
    assert result.returncode == 1
    assert f"{namespace}: namespace 127.0.0.1:{port} -> host 127.0.0.1:{port}: cannot listen" in result.stderr


def test_a_port_taken_on_the_host_fails_the_forwarder_with_its_name(namespace: str, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(forwarder(namespace, "--into", f"{port}:{port}"), capture_output=True, text=True,
                                cwd=REPO, timeout=30, check=False)
    assert result.returncode == 1
    assert f"into {namespace}: host 127.0.0.1:{port} -> namespace 127.0.0.1:{port}: cannot listen" in result.stderr


def test_a_namespace_that_does_not_exist_is_named() -> None:
    result = subprocess.run(forwarder("gpushare-test-absent", "--into", "25100:25101"), capture_output=True,
                            text=True, cwd=REPO, timeout=30, check=False)
    assert result.returncode == 1
    assert "cannot open the network namespace gpushare-test-absent (/run/netns/gpushare-test-absent)" in result.stderr


def test_the_reference_extender_inside_reaches_the_host_through_the_forwarder(
        namespace: str, tmp_path: Path, reference: Path) -> None:
    # What the tier does: the extender, which listens on every interface, in the namespace; its API server
    # requests out to the host's 127.0.0.1 on the same port. Here a stub answers 503 and records the paths.
    paths: list[str] = []

    class Recorder(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            paths.append(self.path.split("?")[0])
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    (tmp_path / "kubeconfig").write_text(
        f"apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
        "current-context: c\n")
    extender = netns.exec_argv(namespace, [str(reference / toolchain.EXTENDER_BINARY)])
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "KUBECONFIG": str(tmp_path / "kubeconfig"),
           "PORT": str(free_port())}
    try:
        with started(forwarder(namespace, "--out", f"{port}:{port}"), tmp_path / "fwd.log") as fwd:
            wait_for_line(tmp_path / "fwd.log", "forwarding", fwd)
            with (tmp_path / "extender.log").open("wb") as out:
                process = subprocess.Popen(extender, env=env, stdout=out, stderr=subprocess.STDOUT,
                                           start_new_session=True)
            try:
                deadline = time.monotonic() + 30
                wanted = {"/api/v1/nodes", "/api/v1/pods", "/api/v1/configmaps"}  # its three informers
                while not wanted <= set(paths) and time.monotonic() < deadline:
                    assert process.poll() is None, (tmp_path / "extender.log").read_text(errors="replace")
                    time.sleep(0.1)
                assert wanted <= set(paths), (tmp_path / "extender.log").read_text(errors="replace")
            finally:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
            assert stop(fwd) == 0
    finally:
        server.shutdown()
        server.server_close()
