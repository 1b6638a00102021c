"""Kubernetes resource quantities ("4Gi", "1536Mi", "4294967296", "1.5e9") as exact GiB or MiB units (pure).

Written here rather than with the kubernetes client's `kubernetes.utils.parse_quantity`, for three reasons: the
protocol imports no kubernetes client (CONTRIBUTING.md, rule 1); that function hands the number to `Decimal`, which
also takes forms the API server refuses (`NaN`, `Infinity`, `1_000`, surrounding spaces); and its arithmetic runs
at `Decimal`'s default 28 digits, rounding where a share must be exact. Here a quantity is the API server's grammar
(one regular expression), bounded in length and exponent, and computed with `Fraction`.
"""

from __future__ import annotations

import re
from fractions import Fraction

from contract.modes import Unit

# k8s.io/apimachinery/pkg/api/resource/quantity.go: <signedNumber><suffix>, suffix binarySI | decimalSI | exponent.
_QUANTITY_RE = re.compile(
    r"([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)"  # sign and number: 4, 1.5, .5
    r"(?:(Ki|Mi|Gi|Ti|Pi|Ei)|([numkMGTPE])|[eE]([+-]?[0-9]+))?"  # binary SI, decimal SI, or decimal exponent
)
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
UNIT_BYTES: dict[Unit, int] = {"GiB": 2**30, "MiB": 2**20}
# The quantity suffix that means one unit: ResourceSlice capacities are written in it.
UNIT_SUFFIX: dict[Unit, str] = {"GiB": "Gi", "MiB": "Mi"}


# The largest quantity the API server keeps is about 2^63 (k8s.io/apimachinery pkg/api/resource: int64 with a scale,
# larger values are clamped); a written form past these bounds is no memory size, and an exponent like 1e9999999
# would cost seconds of arithmetic before it is refused.
MAX_TEXT = 64
MAX_EXPONENT = 30


class QuantityError(ValueError):
    """A quantity that is not a whole, positive number of units; the text says which and why."""


def quantity_bytes(text: str) -> Fraction:
    """The exact number of bytes a quantity means (a Fraction: "1.5Gi" and "100m" are valid quantities)."""
    match = _QUANTITY_RE.fullmatch(text.strip()) if isinstance(text, str) and len(text) <= MAX_TEXT else None
    if match is None:
        shown = text if not isinstance(text, str) or len(text) <= MAX_TEXT else text[:MAX_TEXT] + "..."
        raise QuantityError(f"{shown!r} is not a Kubernetes quantity such as 4Gi or 4096Mi")
    sign, number, binary, decimal, exponent = match.groups()
    if exponent and abs(int(exponent)) > MAX_EXPONENT:
        raise QuantityError(f"{text!r} has exponent {int(exponent)}, outside what a memory size can be "
                            f"(at most {MAX_EXPONENT} either way)")
    value = Fraction(number)
    if binary:
        value *= _BINARY[binary]
    elif decimal:
        value *= Fraction(10) ** _DECIMAL[decimal]
    elif exponent:
        value *= Fraction(10) ** int(exponent)
    return -value if sign == "-" else value


def quantity_units(text: str, unit: Unit) -> int:
    """A quantity as a positive whole number of units, refused when it is not one."""
    value = quantity_bytes(text)
    units = value / UNIT_BYTES[unit]
    if units.denominator != 1:
        raise QuantityError(f"{text} is not a whole number of {unit} (GPUSHARE_UNIT)")
    if units <= 0:
        raise QuantityError(f"{text} is not a positive amount of memory")
    return int(units)


def units_quantity(units: int, unit: Unit) -> str:
    return f"{units}{UNIT_SUFFIX[unit]}"
