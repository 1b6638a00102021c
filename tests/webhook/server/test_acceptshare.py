"""The connection counts the webhook processes share: a process that holds more than a live other one lets it
accept first; slots of processes that are gone are taken again."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from webhook.server.acceptshare import Shares


def gone_pid() -> int:
    """The PID of a process that has already exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.parametrize(
    ("mine", "other", "other_alive", "holds_more"),
    [
        (0, 0, True, False),  # even: accept
        (1, 0, True, True),  # the other holds fewer: let it accept first
        (1, 2, True, False),
        (3, 0, False, False),  # the other process is gone: its count does not count
    ],
)
def test_a_process_holding_more_lets_a_live_other_accept_first(
    mine: int, other: int, other_alive: bool, holds_more: bool,
) -> None:
    shares = Shares(slots=4)
    me = shares.claim(os.getpid())
    them = shares.claim(os.getppid() if other_alive else gone_pid())
    assert me is not None and them is not None and me != them
    shares.publish(me, mine)
    shares.publish(them, other)
    assert shares.holds_more(me) is holds_more


def test_slots_are_released_reclaimed_and_limited() -> None:
    shares = Shares(slots=2)
    first, second = shares.claim(os.getpid()), shares.claim(os.getppid())
    assert (first, second) == (0, 1)
    assert shares.claim(424242) is None  # full while both holders live
    shares.release(1)
    assert shares.claim(os.getppid()) == 1
    dead = Shares(slots=1)
    assert dead.claim(gone_pid()) == 0
    assert dead.claim(os.getpid()) == 0  # the holder is gone: its slot is taken again
