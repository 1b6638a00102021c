"""The parts of kube-apiserver's CEL environment that cel-python lacks and the manifests' policies use.

- `lists.range(n)`: cel-go's lists extension (ext/lists.go, version 2; in the API server's environment from 1.34,
  k8s.io/apiserver pkg/cel/environment/base.go), the list [0, 1, ..., n-1]. cel-python reads `lists.range(n)` as a
  method `range` called on a variable `lists`, so the activation binds `lists` to a namespace marker and the function
  refuses any other receiver.
- `s.substring(start, end)`: cel-go's strings extension (ext/strings.go, substrRange; in the API server's environment
  since 1.29 as version 2, k8s.io/apiserver pkg/cel/environment/base.go), the characters (runes) from `start` up to
  `end`; an index outside the string is an error.
- `JSONPatch{op: ..., path: ..., from: ..., value: ...}`: the type a MutatingAdmissionPolicy's JSONPatch expression
  builds (k8s.io/apiserver pkg/cel/mutation, JSONPatchVal; patch/json_patch.go turns it into an RFC 6902 operation).
  Only those four fields exist; `value` may be any CEL value.

Not modelled: the typed `Object{...}` constructors of ApplyConfiguration, `jsonpatch.escapeKey`, and type checking
at configuration time (a type error surfaces at evaluation instead).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Final

from celpy import celtypes
from celpy.adapter import CELJSONEncoder

JSONPATCH_FIELDS: Final = ("op", "path", "from", "value")


class Namespace(celtypes.MapType):
    """A function namespace of CEL (`lists`), bound as a variable so that cel-python can call its functions."""

    def __init__(self, name: str) -> None:
        super().__init__({})
        self.name = name

    def __repr__(self) -> str:
        return f"Namespace({self.name!r})"


LISTS: Final = Namespace("lists")


def lists_range(receiver: Any, count: Any) -> celtypes.ListType:
    """`lists.range(n)`; a call of `range` on anything but the `lists` namespace does not exist in CEL."""
    if receiver is not LISTS:
        raise TypeError(f"found no matching overload for 'range' applied to {type(receiver).__name__}")
    if not isinstance(count, int) or isinstance(count, bool):
        raise TypeError(f"lists.range takes an int, not {type(count).__name__}")
    return celtypes.ListType([celtypes.IntType(i) for i in range(count)])


def substring(receiver: Any, start: Any, end: Any) -> celtypes.StringType:
    """`s.substring(start, end)` as ext/strings.go substrRange checks it."""
    if not isinstance(receiver, str):
        raise TypeError(f"found no matching overload for 'substring' applied to {type(receiver).__name__}")
    if start > end:
        raise ValueError(f"invalid substring range. start: {start}, end: {end}")
    for index in (start, end):
        if not 0 <= index <= len(receiver):
            raise ValueError(f"index out of range: {index}")
    return celtypes.StringType(receiver[start:end])


class JSONPatch(celtypes.MapType):
    """One JSON Patch operation as a MutatingAdmissionPolicy's expression builds it."""

    def __init__(self, fields: Mapping[Any, Any] | None = None) -> None:
        given = dict(fields or {})
        unknown = sorted(str(k) for k in given if str(k) not in JSONPATCH_FIELDS)
        if unknown:
            raise ValueError(f"JSONPatch has no field {unknown[0]!r}; its fields are {', '.join(JSONPATCH_FIELDS)}")
        super().__init__({celtypes.StringType(k): v for k, v in given.items()})

    def operation(self) -> dict[str, Any]:
        """The RFC 6902 operation, as patch/json_patch.go writes it: op and path always, from when not empty, value
        when set (a CEL value turned into JSON)."""
        fields = {str(k): v for k, v in self.items()}  # celpy's MapType.get raises on a missing key
        out: dict[str, Any] = {"op": str(fields.get("op", "")), "path": str(fields.get("path", ""))}
        if fields.get("from"):
            out["from"] = str(fields["from"])
        if "value" in fields:
            out["value"] = json.loads(json.dumps(fields["value"], cls=CELJSONEncoder))
        return out


FUNCTIONS: Final[dict[str, Callable[..., celtypes.ListType | celtypes.StringType]]] = {
    "range": lists_range, "substring": substring}
NAMESPACES: Final = {"lists": LISTS}
TYPES: Final = {"JSONPatch": JSONPatch}
