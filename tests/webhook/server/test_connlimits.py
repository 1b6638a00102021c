"""The choice a full webhook process makes for a new connection: whose connection it closes, or whether it refuses."""

from __future__ import annotations

import pytest

from webhook.server.connlimits import Ledger, Limit, State, Verdict

Conn = tuple[str, int]  # (client, number): readable names in the tables below


def ledger(total: int, per_client: int, held: dict[str, list[State]]) -> Ledger[Conn]:
    """Connections taken in the order of `held` (each client's in list order), then put in their states."""
    out: Ledger[Conn] = Ledger(total, per_client)
    for client, states in held.items():
        for i, _ in enumerate(states):
            out.add((client, i), client)
    for client, states in held.items():
        for i, state in enumerate(states):
            out.mark((client, i), state)
    return out


IDLE, UNF, BUSY = State.IDLE, State.UNFINISHED, State.BUSY


@pytest.mark.parametrize(("case", "total", "per_client", "held", "newcomer", "verdict"), [
    ("room for it", 10, 5, {"a": [IDLE, IDLE]}, "b", Verdict()),
    ("a client at its limit gives up its oldest idle one", 10, 3, {"a": [BUSY, IDLE, IDLE]}, "a",
     Verdict(Limit.CLIENT, ("a", 1), IDLE)),
    ("a client at its limit with none idle is refused", 10, 3, {"a": [UNF, BUSY, UNF]}, "a",
     Verdict(Limit.CLIENT, refused=True)),
    ("its limit is its own: others are not touched", 10, 2, {"a": [UNF, UNF], "b": [IDLE]}, "a",
     Verdict(Limit.CLIENT, refused=True)),
    ("a full process closes the oldest idle one of the client holding the most", 6, 10,
     {"a": [IDLE, IDLE], "big": [UNF, IDLE, IDLE], "api": [BUSY]}, "api", Verdict(Limit.PROCESS, ("big", 1), IDLE)),
    ("else the oldest unfinished one of that client", 4, 10, {"big": [BUSY, UNF, UNF], "api": [IDLE]}, "api",
     Verdict(Limit.PROCESS, ("big", 1), UNF)),
    ("a client holding only busy ones is passed over for the next", 6, 10,
     {"big": [BUSY, BUSY, BUSY], "mid": [UNF, UNF], "api": [IDLE]}, "api", Verdict(Limit.PROCESS, ("mid", 0), UNF)),
    ("never a client holding no more than the newcomer: its own idle one instead", 4, 10,
     {"a": [UNF, UNF], "b": [IDLE, UNF]}, "b", Verdict(Limit.PROCESS, ("b", 0), IDLE)),
    ("a new client gets in over a heavier client's unfinished connection", 4, 10,
     {"a": [BUSY, BUSY], "b": [BUSY, UNF]}, "c", Verdict(Limit.PROCESS, ("b", 1), UNF)),
    ("nothing to close at all", 2, 10, {"a": [BUSY], "b": [BUSY]}, "c", Verdict(Limit.PROCESS, refused=True)),
    ("a lone flooding client churns its own idle connections", 3, 10, {"a": [IDLE, IDLE, IDLE]}, "a",
     Verdict(Limit.PROCESS, ("a", 0), IDLE)),
])
def test_verdicts(case: str, total: int, per_client: int, held: dict[str, list[State]], newcomer: str,
                  verdict: Verdict[Conn]) -> None:
    assert ledger(total, per_client, held).admit(newcomer) == verdict


def test_an_idle_connection_whose_next_request_arrived_is_not_idle() -> None:
    full = ledger(3, 10, {"big": [IDLE, IDLE], "api": [IDLE]})
    assert full.admit("x", pending=lambda conn: conn == ("big", 0)) == Verdict(Limit.PROCESS, ("big", 1), IDLE)
    assert full.admit("x", pending=lambda conn: conn[0] == "big") == Verdict(Limit.PROCESS, ("api", 0), IDLE)
    assert full.admit("big", pending=lambda conn: conn[0] == "big") == Verdict(Limit.PROCESS, refused=True)


def test_oldest_means_longest_in_its_state() -> None:
    held = ledger(3, 10, {"a": [IDLE, IDLE, IDLE]})
    held.mark(("a", 0), State.BUSY)  # a new request on the oldest: it leaves the idle ones
    held.mark(("a", 0), State.IDLE)  # answered: now the most recently idle
    assert held.admit("a").victim == ("a", 1)


def test_counts_follow_every_change() -> None:
    held = ledger(10, 10, {"a": [IDLE, IDLE, IDLE], "b": [UNF]})
    assert (held.total, held.count("a"), held.busiest()) == (4, 3, ("a", 3))
    held.remove(("a", 0))
    held.remove(("a", 1))
    assert held.busiest() in {("a", 1), ("b", 1)}
    held.remove(("a", 2))
    held.remove(("a", 2))  # twice: closed to make room, then its task ends
    held.mark(("a", 2), State.IDLE)  # a closed connection's late state change is ignored
    assert (held.total, held.count("a"), held.busiest()) == (1, 0, ("b", 1))
    held.remove(("b", 0))
    assert (held.total, held.busiest()) == (0, ("", 0))
