"""GPUSHARE_ADMISSION_SOURCES: the kernel drops connections to the admission port from anywhere else.

The filters are loaded into real listening sockets on loopback and real clients connect to them from chosen local
addresses (127.0.0.0/8 is all local on Linux): a source outside the list never gets a connection (its SYN is
dropped, so its connect never completes), one inside does. Then the same against the real webhook, with its exec
probe and /readyz.
"""

from __future__ import annotations

import ipaddress
import select
import socket
from pathlib import Path

import pytest

from common.settings import SettingsError
from tests.harness.webhook.server import webhook_server
from webhook.server import probe, sourcefilter
from webhook.server.settings import settings_from

# How long a dropped client is given to get through; a kept one connects at once over loopback.
WAIT = 1.0


def _listener(host: str, nets: list[str]) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # dual stack: IPv4 clients too
    sock.bind((host, 0))
    sock.listen(8)
    sourcefilter.load(sock, sourcefilter.program([ipaddress.ip_network(n) for n in nets]))
    return sock


def connects(port: int, source: str, target: str = "") -> bool:
    """Whether a TCP connection from `source` to `port` on loopback completes within WAIT."""
    family = socket.AF_INET6 if ":" in source else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as client:
        client.bind((source, 0))
        client.setblocking(False)
        code = client.connect_ex((target or ("::1" if family == socket.AF_INET6 else "127.0.0.1"), port))
        if code == 0:
            return True
        _, writable, _ = select.select([], [client], [], WAIT)
        return bool(writable) and client.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0


@pytest.mark.parametrize(
    ("listen", "allowed", "source", "kept"),
    [
        ("127.0.0.1", ["127.0.0.2/32"], "127.0.0.2", True),
        ("127.0.0.1", ["127.0.0.2/32"], "127.0.0.3", False),
        ("127.0.0.1", ["127.0.0.0/30"], "127.0.0.3", True),  # a prefix within the last byte
        ("127.0.0.1", ["127.0.0.0/30"], "127.0.0.5", False),
        ("127.0.0.1", ["10.0.0.0/8", "127.0.0.8/29"], "127.0.0.9", True),  # the second of two
        ("127.0.0.1", ["::/0"], "127.0.0.2", False),  # IPv6 networks say nothing of IPv4 sources
        ("::1", ["::1/128"], "::1", True),
        ("::1", ["::/127"], "::1", True),  # a prefix within the last word
        ("::1", ["::2/127"], "::1", False),
        ("::1", ["fe80::/10"], "::1", False),  # differs in the first word
        ("::1", ["0.0.0.0/0"], "::1", False),
        ("::", ["127.0.0.2/32"], "127.0.0.2", True),  # a dual-stack listener sees IPv4 packets
        ("::", ["127.0.0.2/32", "::1/128"], "127.0.0.3", False),
    ],
)
def test_the_kernel_keeps_only_listed_sources(listen: str, allowed: list[str], source: str, kept: bool) -> None:
    with _listener(listen, allowed) as sock:
        assert connects(sock.getsockname()[1], source) is kept


def test_an_empty_list_keeps_nothing_and_loopback_is_always_added() -> None:
    with _listener("127.0.0.1", []) as sock:
        assert not connects(sock.getsockname()[1], "127.0.0.1")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        sourcefilter.attach(sock, [ipaddress.ip_network("127.0.0.2/32")])
        port = sock.getsockname()[1]
        assert connects(port, "127.0.0.1")  # the container's own probe
        assert connects(port, "127.0.0.2")
        assert not connects(port, "127.0.0.3")


def test_the_list_is_parsed_merged_and_bounded() -> None:
    assert [str(n) for n in sourcefilter.networks(" 10.0.0.0/25, 10.0.0.128/25,,fd00::1 ")] == ["10.0.0.0/24",
                                                                                               "fd00::1/128"]
    assert sourcefilter.networks("") == ()
    with pytest.raises(sourcefilter.FilterError, match=r"'10\.0\.0\.1/8' is not an IPv4 or IPv6 network"):
        sourcefilter.networks("10.0.0.1/8")  # host bits set: a typo more often than not
    many = ",".join(f"fd00::{i:x}/128" for i in range(0, 2 * 4096, 2))
    with pytest.raises(sourcefilter.FilterError, match=r"more than the kernel's 4096: list fewer, wider networks"):
        sourcefilter.networks(many)


@pytest.mark.parametrize(
    ("peer", "admitted"),
    [
        (("10.244.0.1", 50000), True),
        (("10.244.0.2", 50000), False),
        (("::ffff:10.244.0.1", 50000, 0, 0), True),  # an IPv4 client of a dual-stack listener
        (("fd00::5", 50000, 0, 0), True),
        (("fd01::5", 50000, 0, 0), False),
        (("127.0.0.1", 1), True),  # the container's own probe
        (("::1", 1, 0, 0), True),
        (("127.0.0.2", 1), False),
        (("", 0), False),
        ("/run/unix.sock", False),  # not an address
    ],
)
def test_where_the_kernel_refuses_the_filter_the_worker_checks_the_same_list(peer: object, admitted: bool) -> None:
    sources = sourcefilter.Sources(sourcefilter.networks("10.244.0.1/32,fd00::/64"))
    assert sources.admits(peer) is admitted


def test_an_outsider_is_reset_at_once() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        with socket.create_connection(listener.getsockname(), timeout=5) as client:
            conn, _ = listener.accept()
            sourcefilter.reset(conn)
            with pytest.raises(ConnectionResetError):
                client.recv(1)


def test_a_bad_list_stops_the_start_with_the_variable_named() -> None:
    with pytest.raises(SettingsError, match=r"GPUSHARE_ADMISSION_SOURCES='10.0.0.0/33' is not valid: .*expected "
                                            r"comma-separated networks"):
        settings_from({"GPUSHARE_ADMISSION_SOURCES": "10.0.0.0/33"})


@pytest.mark.parametrize(("bind", "target"), [("0.0.0.0:8443", ("127.0.0.1", 8443)), ("[::]:9443", ("::1", 9443)),
                                              ("10.1.2.3:8443", ("10.1.2.3", 8443))])
def test_the_probe_connects_from_loopback_where_it_can(bind: str, target: tuple[str, int]) -> None:
    assert probe.target(bind) == target
    assert probe.bound_host(bind) == (ipaddress.ip_network(target[0]) if target[0] == "10.1.2.3" else None)


def test_the_real_webhook_drops_other_sources_and_its_probe_gets_through(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    with webhook_server(tmp_path, {"GPUSHARE_ADMISSION_SOURCES": "127.0.0.2/32", "GPUSHARE_WORKERS": "2"}) as hook:
        assert connects(hook.port, "127.0.0.2")
        assert not connects(hook.port, "127.0.0.3")
        env = {"GPUSHARE_BIND": f"127.0.0.1:{hook.port}"}
        assert probe.main(["/readyz"], env) == 0
        assert f"/readyz on 127.0.0.1:{hook.port}: HTTP 200: ok" in capsys.readouterr().out
        assert probe.main(["/nope"], env) == 2
        log = hook.log_text()
    assert "drops connections to 127.0.0.1:" in log and "GPUSHARE_ADMISSION_SOURCES=127.0.0.2/32" in log


def test_the_probe_names_what_did_not_answer(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: refused
        assert probe.main(["/healthz"], {"GPUSHARE_BIND": f"0.0.0.0:{port}"}) == 1
    assert f"/healthz on 127.0.0.1:{port} did not answer" in capsys.readouterr().out



def test_the_probe_waits_as_long_as_it_is_told_and_refuses_a_bad_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)  # the kernel completes the connection; nothing accepts it, so no TLS answer comes
        env = {"GPUSHARE_BIND": f"127.0.0.1:{sock.getsockname()[1]}"}
        assert probe.main(["/healthz", "--timeout", "0.3"], env) == 1
        assert "did not answer: " in capsys.readouterr().out
        for bad in ("0", "-1", "61", "soon"):
            assert probe.main(["/healthz", "--timeout", bad], env) == 2
        assert "--timeout" in capsys.readouterr().err
