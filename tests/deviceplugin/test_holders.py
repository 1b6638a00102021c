"""Who may hold a device-ID set: the suspects the watch names, then the kubelet's Get, List and checkpoint, in that
order, each asked only when the one before cannot say; and what the owner's decision makes of the answer."""

from __future__ import annotations

import pytest

from deviceplugin.errors import PluginError
from deviceplugin.holders import GET_LIMIT, Suspects, held
from deviceplugin.kubelet import Holding
from deviceplugin.owners import Owner, Owners
from tests.harness.plugin.fakes import NODE, FakeApiServer, FakeHoldings

A = Holding("team", "a", "main", ("d1", "d2"))
B = Holding("team", "b", "main", ("d3",))
INIT = Holding("", "", "init", ("d3", "d4"), pod_uid="uid-c")  # the checkpoint knows the pod by UID only


def test_a_suspect_holding_exactly_the_ids_is_found_by_get_without_listing() -> None:
    kubelet = FakeHoldings([A, B], get=True)
    found = held(kubelet, ["d2", "d1"], [("team", "b", "uid-b"), ("team", "a", "uid-a")])
    assert (found.source, found.holdings, kubelet.asked) == ("get", [A], ["get team/b", "get team/a"])


@pytest.mark.parametrize("get", [True, False])
def test_without_a_matching_suspect_the_node_is_listed(get: bool) -> None:
    kubelet = FakeHoldings([A, B], get=get)
    found = held(kubelet, ["d1", "d2"], [("team", "b", "uid-b")])
    assert (found.source, found.listed) == ("list", [A, B])
    assert kubelet.asked == ["get team/b", "list"]  # with Get, b holds other IDs; without, Get says nothing
    assert Owners(FakeApiServer(), NODE).owner(["d1", "d2"], found, None) == Owner("team", "a", "", ("main",))


def test_an_init_container_is_found_in_the_checkpoint_and_named_from_the_suspects() -> None:
    kubelet = FakeHoldings([A], recorded=[INIT])
    suspects = [("team", "c", "uid-c")]
    found = held(kubelet, ["d4", "d3"], suspects)
    assert (found.source, found.holdings, found.listed, kubelet.asked) == (
        "checkpoint", [INIT], [A], ["get team/c", "list", "checkpoint"])
    assert Owners(FakeApiServer(), NODE).owner(["d3", "d4"], found, suspects) == Owner("team", "c", "uid-c", ("init",))


def test_a_checkpoint_entry_another_listed_pod_contradicts_is_refused() -> None:
    found = held(FakeHoldings([B], recorded=[INIT]), ["d3", "d4"], [("team", "c", "uid-c")])
    with pytest.raises(PluginError) as err:
        Owners(FakeApiServer(), NODE).owner(["d3", "d4"], found, [("team", "c", "uid-c")])
    assert err.value.code == "FAILED_PRECONDITION" and "team/b" in err.value.message


@pytest.mark.parametrize(("unavailable", "named"), [
    ("list", "GPUSHARE_POD_RESOURCES_SOCKET"), ("checkpoint", "GPUSHARE_KUBELET_CHECKPOINT")])
def test_a_kubelet_source_that_cannot_answer_is_named(unavailable: str, named: str) -> None:
    kubelet = FakeHoldings([B], unavailable=frozenset({unavailable}))
    with pytest.raises(PluginError) as err:
        held(kubelet, ["d1", "d2"], None)
    assert err.value.code == "UNAVAILABLE" and named in err.value.message


def test_suspects_name_the_slot_holders_first_and_say_nothing_until_ready_or_when_too_many() -> None:
    suspects = Suspects()
    suspects.add("uid-w", "team", "waiting", [(2, None)])
    suspects.add("uid-h", "team", "holding", [(2, "slot")])
    assert suspects.likely(2, "slot") is None  # not ready: a pod the watch has not delivered may hold them
    suspects.ready = True
    assert suspects.likely(2, "slot") == [("team", "holding", "uid-h"), ("team", "waiting", "uid-w")]
    assert suspects.likely(2, "other") == [("team", "waiting", "uid-w")]
    assert suspects.waiting(2, "other") and not suspects.waiting(3, "slot")
    for n in range(GET_LIMIT):
        suspects.add(f"uid-{n}", "team", f"p{n}", [(2, None)])
    assert suspects.likely(2, "other") is None  # more than GET_LIMIT: listing the node is cheaper
    suspects.drop("uid-w", [(2, None)])
    suspects.drop("uid-h", [(2, "slot")])
    assert suspects.likely(2, "slot") == [("team", f"p{n}", f"uid-{n}") for n in range(GET_LIMIT)]
    assert not suspects.waiting(3, "x")
