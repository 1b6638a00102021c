from __future__ import annotations

from fractions import Fraction

import pytest

from contract.modes import Unit
from contract.quantity import QuantityError, quantity_bytes, quantity_units, units_quantity


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4Gi", 4 * 2**30),
        ("1536Mi", 1536 * 2**20),
        ("4294967296", 2**32),
        ("1.5Gi", 3 * 2**29),
        ("2G", 2 * 10**9),
        ("1e3", 1000),
        ("100m", Fraction(1, 10)),
        ("-1Ki", -1024),
    ],
)
def test_quantity_bytes_are_exact(text: str, expected: Fraction | int) -> None:
    assert quantity_bytes(text) == expected


@pytest.mark.parametrize(
    ("text", "unit", "units"),
    [("4Gi", "GiB", 4), ("4096Mi", "GiB", 4), ("4Gi", "MiB", 4096), ("1536Mi", "MiB", 1536), ("1048576", "MiB", 1)],
)
def test_whole_units(text: str, unit: Unit, units: int) -> None:
    assert quantity_units(text, unit) == units


@pytest.mark.parametrize(
    ("text", "unit", "words"),
    [
        ("1536Mi", "GiB", "not a whole number of GiB"),
        ("1G", "MiB", "not a whole number of MiB"),
        ("0", "GiB", "not a positive amount"),
        ("-1Gi", "GiB", "not a positive amount"),
        ("4 GiB", "GiB", "not a Kubernetes quantity"),
        ("", "GiB", "not a Kubernetes quantity"),
        # Bounded before any arithmetic: 10**9999999 as a Fraction takes seconds.
        ("1e9999999", "GiB", "has exponent 9999999, outside what a memory size can be"),
        ("1e-9999999", "GiB", "has exponent -9999999"),
        ("1" * 65, "GiB", "not a Kubernetes quantity"),
    ],
)
def test_refused_quantities(text: str, unit: Unit, words: str) -> None:
    with pytest.raises(QuantityError, match=words):
        quantity_units(text, unit)


def test_units_quantity() -> None:
    assert (units_quantity(16, "GiB"), units_quantity(16384, "MiB")) == ("16Gi", "16384Mi")
