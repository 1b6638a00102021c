"""Who may open a connection to the admission port: a socket filter on the listening socket, run by the kernel.

GPUSHARE_ADMISSION_SOURCES lists the API server's source addresses (CIDRs). A classic BPF program attached to the
listening socket (SO_ATTACH_FILTER, which needs no capability) drops every packet from another source, the SYN
included: Linux runs a listener's filter on each incoming segment before the handshake (net/ipv4/tcp_ipv4.c,
tcp_v4_rcv calls tcp_filter for TCP_LISTEN and TCP_NEW_SYN_RECV sockets; net/ipv6/tcp_ipv6.c likewise), and an
accepted connection inherits it (sk_clone_lock). So no connection from elsewhere reaches the accept queue, where
a new connection of the API server would otherwise wait behind a flood before any limit of ours could see it
(webhook/server/connlimits.py only sees what was accepted). The dropped client sees its SYNs unanswered.

Upstream Linux attaches a classic filter for any process (net/core/filter.c, sk_attach_filter checks no
capability), but some kernels allow it only with CAP_NET_ADMIN, which the webhook's container does not hold (the
real-cluster tier's machine is one). There the worker checks the same list at accept (Sources) and resets a
connection from elsewhere before any TLS work, up to _OUTSIDERS_PER_WAKE of them per wake-up (webhook/server/worker.py):
the flood then still passes through the accept queue, but each connection of it costs a few microseconds there.

The program reads the source address relative to the network header (SKF_NET_OFF), so one program serves an IPv4
listener and a dual-stack IPv6 one, whose IPv4 clients arrive as IPv4 packets. Loopback is always admitted
(LOOPBACK): the container's own probes connect there (manifests/base/webhook.yaml).
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import logging
import socket
import struct
from collections.abc import Iterable, Sequence

from webhook.server.probe import bound_host

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
log = logging.getLogger(__name__)

# include/uapi/asm-generic/socket.h (every architecture Kubernetes nodes run: amd64, arm64, ppc64le, s390x).
SO_ATTACH_FILTER = 26
# include/uapi/linux/filter.h: the largest classic program the kernel loads.
BPF_MAXINSNS = 4096
# Classic BPF opcodes (include/uapi/linux/bpf_common.h).
_LD_W_ABS = 0x00 | 0x00 | 0x20  # BPF_LD | BPF_W | BPF_ABS
_LD_B_ABS = 0x00 | 0x10 | 0x20  # BPF_LD | BPF_B | BPF_ABS
_ALU_AND_K = 0x04 | 0x50 | 0x00  # BPF_ALU | BPF_AND | BPF_K
_ALU_RSH_K = 0x04 | 0x70 | 0x00  # BPF_ALU | BPF_RSH | BPF_K
_JMP_JA = 0x05 | 0x00  # BPF_JMP | BPF_JA
_JMP_JEQ_K = 0x05 | 0x10 | 0x00  # BPF_JMP | BPF_JEQ | BPF_K
_RET_K = 0x06 | 0x00  # BPF_RET | BPF_K
# SKF_NET_OFF (include/uapi/linux/filter.h): offsets from the network header, whatever the socket's family.
_NET = -0x100000
_V4_SOURCE = 12  # iphdr.saddr
_V6_SOURCE = 8  # ipv6hdr.saddr, four 32-bit words
_KEEP, _DROP = 0xFFFFFFFF, 0

# The addresses a process in the webhook's own network namespace connects from to 127.0.0.1 or ::1.
LOOPBACK: tuple[Network, ...] = (ipaddress.ip_network("127.0.0.1/32"), ipaddress.ip_network("::1/128"))

Instruction = tuple[int, int, int, int]  # code, jt, jf, k


class FilterError(ValueError):
    """The list cannot become a program; the text says why and what to do."""


def networks(text: str) -> tuple[Network, ...]:
    """Comma-separated CIDRs (a bare address is one host) -> the networks, merged; empty text: every source."""
    found: list[Network] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            found.append(ipaddress.ip_network(part, strict=True))
        except ValueError as exc:
            raise FilterError(f"{part!r} is not an IPv4 or IPv6 network ({exc})") from exc
    merged = _merged(found)
    program(merged + LOOPBACK)  # too long a list fails here, at start, not when the socket is set up
    return merged


def _merged(found: Iterable[Network]) -> tuple[Network, ...]:
    v4 = [n for n in found if isinstance(n, ipaddress.IPv4Network)]
    v6 = [n for n in found if isinstance(n, ipaddress.IPv6Network)]
    return (*ipaddress.collapse_addresses(v4), *ipaddress.collapse_addresses(v6))


def _word(value: int, index: int, total: int) -> int:
    return (value >> (32 * (total - 1 - index))) & 0xFFFFFFFF


def _matches(network: Network, offset: int) -> list[Instruction]:
    """Instructions that return _KEEP when the source is in `network`, and fall through to the next otherwise."""
    words = network.max_prefixlen // 32
    checked = [(i, _word(int(network.network_address), i, words), _word(int(network.netmask), i, words))
               for i in range(words)]
    checked = [(i, value, mask) for i, value, mask in checked if mask]  # /0 words compare nothing
    out: list[Instruction] = []
    for n, (i, value, mask) in enumerate(checked):
        out.append((_LD_W_ABS, 0, 0, (_NET + offset + 4 * i) & 0xFFFFFFFF))
        if mask != 0xFFFFFFFF:
            out.append((_ALU_AND_K, 0, 0, mask))
        rest = checked[n + 1:]  # after a mismatch skip what is left of this network's checks and its return
        skip = sum(3 if m != 0xFFFFFFFF else 2 for _, _, m in rest) + 1
        out.append((_JMP_JEQ_K, 0, skip, value))
    out.append((_RET_K, 0, 0, _KEEP))
    return out


def program(allowed: Sequence[Network]) -> list[Instruction]:
    """The filter: keep packets whose source is in `allowed`, drop the rest (and anything not IPv4 or IPv6)."""
    v4 = [i for n in allowed if n.version == 4 for i in _matches(n, _V4_SOURCE)] + [(_RET_K, 0, 0, _DROP)]
    v6 = [i for n in allowed if n.version == 6 for i in _matches(n, _V6_SOURCE)] + [(_RET_K, 0, 0, _DROP)]
    head: list[Instruction] = [
        (_LD_B_ABS, 0, 0, _NET & 0xFFFFFFFF),  # version and header length
        (_ALU_RSH_K, 0, 0, 4),
        (_JMP_JEQ_K, 1, 0, 4),  # IPv4: go on after the next instruction
        (_JMP_JA, 0, 0, len(v4)),  # else past the IPv4 checks (ja takes a 32-bit offset; jt and jf 8-bit ones)
    ]
    v6_head: list[Instruction] = [(_JMP_JEQ_K, 1, 0, 6), (_RET_K, 0, 0, _DROP)]
    code = head + v4 + v6_head + v6
    if len(code) > BPF_MAXINSNS:
        raise FilterError(f"GPUSHARE_ADMISSION_SOURCES makes a filter of {len(code)} instructions, more than the "
                          f"kernel's {BPF_MAXINSNS}: list fewer, wider networks")
    return code


class Sources:
    """The same list, checked in the process for a peer address that accept() returned: where the kernel refuses the
    filter (some kernels allow SO_ATTACH_FILTER only with CAP_NET_ADMIN, which the webhook does not hold)."""

    def __init__(self, allowed: Sequence[Network]) -> None:
        self.allowed = tuple(allowed)
        self._all = _merged([*allowed, *LOOPBACK])

    def admits(self, peer: object) -> bool:
        """Whether the (host, port, ...) accept() gave is in the list; an IPv4 client of a dual-stack listener
        comes as ::ffff:a.b.c.d."""
        try:
            address = ipaddress.ip_address(peer[0])  # type: ignore[index]
        except (TypeError, IndexError, ValueError):
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in network for network in self._all)


def reset(conn: socket.socket) -> None:
    """Close with a reset (SO_LINGER 0): nothing is read, and no TIME_WAIT is left behind."""
    with contextlib.suppress(OSError):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


def attach(sock: socket.socket, allowed: Sequence[Network]) -> None:
    """Install the filter for `allowed` (plus LOOPBACK) on a listening socket; it replaces any filter there."""
    load(sock, program(_merged([*allowed, *LOOPBACK])))


def load(sock: socket.socket, code: Sequence[Instruction]) -> None:
    """Attach a classic BPF program to `sock` (SO_ATTACH_FILTER)."""
    raw = b"".join(struct.pack("=HBBI", *instruction) for instruction in code)
    buffer = ctypes.create_string_buffer(raw, len(raw))
    fprog = struct.pack("@HP", len(code), ctypes.addressof(buffer))  # struct sock_fprog {u16 len; filter *}
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)


def guard(listeners: Sequence[socket.socket], admission_sources: Sequence[Network], bind: str) -> Sources | None:
    """Attach the filter for GPUSHARE_ADMISSION_SOURCES to the listening sockets every worker shares (each worker
    does, so a listener gunicorn made anew on a reload gets it before any worker accepts on it). None: the kernel
    keeps the list, or there is none; else the Sources the worker must check at accept, the kernel having refused."""
    if not admission_sources:
        return None
    own = bound_host(bind) if bind else None  # where the probe connects when not loopback
    sources = Sources((*admission_sources, *([own] if own else [])))
    for sock in listeners:
        try:
            attach(sock, sources.allowed)
        except OSError as exc:
            log.warning("The kernel refused the socket filter for %s (%s; some kernels allow it only with "
                        "CAP_NET_ADMIN): connections from outside GPUSHARE_ADMISSION_SOURCES=%s are reset at accept "
                        "instead, before any TLS work (gpushare_webhook_connections_outside_sources_total). They still "
                        "pass through the kernel's accept queue.", bind, exc.strerror or exc,
                        ",".join(map(str, admission_sources)))
            return sources
    return None
