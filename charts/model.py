"""The chart as data: the overlays' objects merged into one list, each part of it under the value that selects it.

Objects both overlays render alike are unconditional; objects or fields only one overlay or component has are
kept under a condition on the value that selects it; fields the chart's values set are marked with their knob.
The generator refuses what it cannot express (a field the overlays set to two different values), so the chart
can never silently differ from the manifests.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from charts import kustomize
from charts.knobs import CAPABILITIES, GATES, KNOBS, MODE_VALUE, MODES, SWITCHES, Knob, Where, component_value
from charts.kustomize import Obj, key


class ModelError(Exception):
    """The manifests hold something the chart cannot express; the text names the object, the field and the fix."""


@dataclass
class When:
    """A field present only while `condition` (a Helm expression) holds."""

    condition: str
    value: Any


@dataclass
class Knobbed:
    """A field whose value comes from KNOBS[index]."""

    index: int


@dataclass
class Splice:
    """Entries written into a map at this place: a map value's (Knobbed, of an `append` knob), or those a named
    template of templates/_helpers.tpl writes (its name). Its key in the model's map only keeps it apart."""

    source: Knobbed | str


@dataclass
class Part:
    obj: Obj
    origin: str  # the manifest file it comes from
    condition: str | None  # the whole object only while this holds


def mode_condition(mode: str) -> str:
    return f'eq .Values.{MODE_VALUE} "{mode}"'


def component_helper(folder: str) -> str:
    """The named template that says whether a component of CAPABILITIES is on ("true") for this install."""
    return f"gpushare.{component_value(folder)}.enabled"


def component_condition(folder: str) -> str:
    if folder in CAPABILITIES:
        return f'(eq (include "{component_helper(folder)}" .) "true")'
    return f".Values.{component_value(folder)}.enabled"


def term(condition: str) -> str:
    """`condition` as one operand of `and` or `not`: in parentheses unless it is one already."""
    return condition if " " not in condition or condition.startswith("(") else f"({condition})"


def both(first: str | None, second: str) -> str:
    return second if first is None else f"and {term(first)} {term(second)}"


def _names(items: list[Any]) -> list[str] | None:
    """The `name` of every item of a list of named maps (containers, env, ports, webhooks), or None."""
    names = [item.get("name") if isinstance(item, dict) else None for item in items]
    if any(not isinstance(n, str) for n in names) or len(set(names)) != len(names):
        return None
    return [str(n) for n in names]


def _merge_named(base: list[Any], variant: list[Any], only_variant: str, only_base: str, where: str) -> list[Any]:
    """Lists of named maps: items only one render has are kept under its condition, at their place."""
    base_names, variant_names = _names(base) or [], _names(variant) or []
    common = [n for n in base_names if n in variant_names]
    if common != [n for n in variant_names if n in base_names]:
        raise ModelError(f"{where} lists the same items in another order in the two renders; keep their order.")
    merged: list[Any] = []
    i = j = 0
    while i < len(base) or j < len(variant):
        if i < len(base) and base_names[i] not in variant_names:
            merged.append(When(only_base, base[i]))
            i += 1
        elif j < len(variant) and variant_names[j] not in base_names:
            merged.append(When(only_variant, variant[j]))
            j += 1
        else:
            merged.append(merge(base[i], variant[j], only_variant, only_base, f"{where}[name={base_names[i]}]"))
            i += 1
            j += 1
    return merged


def merge(base: Any, variant: Any, only_variant: str, only_base: str, where: str) -> Any:
    """One tree for two renders that differ only by added or removed map keys or named list items (kept under
    conditions)."""
    if base == variant:
        return base
    if isinstance(base, list) and isinstance(variant, list) and _names(base) and _names(variant):
        return _merge_named(base, variant, only_variant, only_base, where)
    if isinstance(base, dict) and isinstance(variant, dict):
        merged: dict[str, Any] = {}
        for k in [*base, *(k for k in variant if k not in base)]:
            if k not in variant:
                merged[k] = When(only_base, base[k])
            elif k not in base:
                merged[k] = When(only_variant, variant[k])
            else:
                merged[k] = merge(base[k], variant[k], only_variant, only_base, f"{where}.{k}")
        return merged
    raise ModelError(f"{where} differs between the renders ({base!r} and {variant!r}); the chart can only keep fields "
                     "that one render adds or removes. Express the difference as an added field, or as a chart "
                     "value in charts/knobs.py.")


def _rendered(overlay: str, parts: tuple[str, ...] = ()) -> dict[tuple[str, str, str], tuple[Obj, str]]:
    """The overlay with the components `parts`, every workload on the overlay's pinned image (the default of the
    chart's one image value, charts/knobs.py), the components' too."""
    out = {}
    for obj in kustomize.render(overlay, parts, kustomize.overlay_images(overlay) if parts else None, origins=True):
        source = kustomize.origin(obj)
        out[key(obj)] = (obj, source)
    return out


def _describe(k: tuple[str, str, str]) -> str:
    kind, namespace, name = k
    return f"{kind} {namespace + '/' if namespace else ''}{name}"


def objects() -> list[Part]:
    """Every object of both overlays and of every component, under the value that selects it."""
    (cm_mode, cm_dir), (ss_mode, ss_dir) = sorted(MODES.items())
    cm, ss = _rendered(cm_dir), _rendered(ss_dir)
    parts: dict[tuple[str, str, str], Part] = {}
    for k in [*cm, *(k for k in ss if k not in cm)]:
        if k not in ss:
            parts[k] = Part(cm[k][0], cm[k][1], mode_condition(cm_mode))
        elif k not in cm:
            parts[k] = Part(ss[k][0], ss[k][1], mode_condition(ss_mode))
        else:
            obj = merge(ss[k][0], cm[k][0], mode_condition(cm_mode), mode_condition(ss_mode), _describe(k))
            parts[k] = Part(obj, ss[k][1], None)
    for folder in kustomize.components():
        condition = component_condition(folder)
        with_cm: dict[tuple[str, str, str], tuple[Obj, str]] | None = None
        for k, (obj, source) in _rendered(ss_dir, (folder,)).items():
            if k not in ss:
                parts[k] = Part(obj, source, condition)
            elif obj != ss[k][0]:
                variant = obj
                if parts[k].obj != ss[k][0]:
                    # The object differs by certificate mode too: merge the component's render of both modes, then
                    # that with the merged base, so the fields of each difference keep their own condition.
                    with_cm = with_cm if with_cm is not None else _rendered(cm_dir, (folder,))
                    variant = merge(obj, with_cm[k][0], mode_condition(cm_mode), mode_condition(ss_mode),
                                    _describe(k))
                parts[k].obj = merge(parts[k].obj, variant, condition, f"not {condition}", _describe(k))
    component_conditions = {component_condition(folder) for folder in kustomize.components()}
    for switch in SWITCHES:
        for k, part in parts.items():
            if part.obj["kind"] != switch.kind:
                continue
            if part.condition is None:
                part.condition = f".Values.{switch.value}"
            elif part.condition in component_conditions:
                part.condition = f"and {part.condition} .Values.{switch.value}"
            else:
                raise ModelError(f"{_describe(k)} is already under {part.condition}; the chart value "
                                 f"{switch.value} can only switch objects of every render or of a component.")
    for gate in GATES:
        for part in parts.values():
            if part.obj["kind"] in gate.kinds:
                part.condition = both(part.condition, gate.condition)
    return list(parts.values())


_STEP = re.compile(r"^([^\[\]]+)(?:\[(\*|\d+|[\w.-]+=[^\]]+)\])?$")
# The steps of a path: split at the dots outside brackets (a name in brackets may hold dots).
_STEPS = re.compile(r"[^.\[]+(?:\[[^\]]*\])?")


def _children(node: Any, step: str, where: str) -> Iterator[tuple[Any, Any]]:
    """(container, key) of the fields one path step reaches from `node`."""
    match = _STEP.match(step)
    if match is None:
        raise ModelError(f"{where}: cannot read the path step {step!r}")
    name, selector = match.groups()
    if isinstance(node, When):
        node = node.value
    if not isinstance(node, dict) or name not in node:
        return
    if selector is None:
        yield node, name
        return
    items = node[name].value if isinstance(node[name], When) else node[name]
    for index, item in enumerate(items):
        if selector == "*" or selector == str(index):
            yield items, index
        elif "=" in selector:
            field, wanted = selector.split("=", 1)
            value = item.value if isinstance(item, When) else item
            if isinstance(value, dict) and str(value.get(field)) == wanted:
                yield items, index


def _fields(obj: Obj, path: str) -> list[tuple[Any, Any]]:
    found: list[tuple[Any, Any]] = [({"": obj}, "")]
    for step in _STEPS.findall(path):
        found = [c for parent, k in found for c in _children(parent[k], step, path)]
    return found


def _matches(parts: list[Part], where: Where) -> list[tuple[Any, Any]]:
    out = []
    for part in parts:
        kind, name = part.obj["kind"], part.obj["metadata"]["name"]
        if where.kind in (kind, "*") and where.name in (name, "*"):
            out.extend(_fields(part.obj, where.path))
    return out


def _absent(knob: Knob, index: int, parts: list[Part]) -> list[tuple[Any, Any]]:
    """Add the field an `absent` knob sets, which the manifests lack, to every map that would hold it."""
    fields = []
    for where in knob.where:
        *steps, last = _STEPS.findall(where.path)
        if not steps or re.fullmatch(r"[\w-]+", last) is None:
            raise ModelError(f"The chart value {knob.values[0].path} adds {where.path}, whose last step must be a "
                             "plain field name.")
        for parent, k in _matches(parts, Where(where.kind, where.name, ".".join(steps))):
            node = parent[k].value if isinstance(parent[k], When) else parent[k]
            if not isinstance(node, dict) or last in node:
                raise ModelError(f"The chart value {knob.values[0].path} adds {where.path}, which the manifests "
                                 "hold already; drop `absent` in charts/knobs.py, so that its default is theirs.")
            node[last] = Knobbed(index)
            fields.append((node, last))
    return fields


def apply_knobs(parts: list[Part]) -> dict[str, Any]:
    """Mark every field a knob sets; returns each value's default (what the manifests hold there)."""
    defaults: dict[str, Any] = {}
    for index, knob in enumerate(KNOBS):
        names = ", ".join(v.path for v in knob.values)
        if knob.absent is not None:
            if not _absent(knob, index, parts):
                raise ModelError(f"The chart value {names} adds {knob.where}, which no object of the manifests "
                                 "could hold; fix the path in charts/knobs.py.")
            defaults[knob.values[0].path] = knob.absent
            continue
        fields = [f for where in knob.where for f in _matches(parts, where)]
        if not fields:
            raise ModelError(f"The chart value {names} sets {knob.where}, which no object of the manifests has; "
                             "fix the path in charts/knobs.py.")
        held = [parent[k].value if isinstance(parent[k], When) else parent[k] for parent, k in fields]
        if knob.append:
            defaults[knob.values[0].path] = _append(knob, index, held)
            continue
        if any(h != held[0] for h in held):
            raise ModelError(f"The fields the chart value {names} sets hold different values in the manifests "
                             f"({held}); give them one value, or split the knob in charts/knobs.py.")
        for value, default in zip(knob.values, _defaults(knob, held[0]), strict=True):
            defaults[value.path] = default
        for parent, k in fields:
            if isinstance(parent[k], When):
                parent[k].value = Knobbed(index)
            else:
                parent[k] = Knobbed(index)
    return defaults


def _append(knob: Knob, index: int, held: list[Any]) -> list[Any] | dict[str, Any]:
    """Mark where an append knob's items go in each list (or map) it sets; returns the value's default."""
    (value,) = knob.values
    if knob.keep is None and held and all(isinstance(entries, dict) for entries in held):
        for entries in held:
            entries[f"<{value.path}>"] = Splice(Knobbed(index))
        return {}
    if not all(isinstance(items, list) for items in held):
        raise ModelError(f"The chart value {value.path} adds items to {knob.where}, which is no list.")
    if knob.keep is None:
        for items in held:
            items.append(Knobbed(index))
        return []
    if any(items != held[0] for items in held) or len(held[0]) < knob.keep:
        raise ModelError(f"The chart value {value.path} sets the items after the first {knob.keep} of {knob.where}, "
                         f"which the manifests must give one list of at least {knob.keep} items; they hold {held}.")
    default: list[Any] = held[0][knob.keep:]
    for items in held:
        items[knob.keep:] = [Knobbed(index)]
    return default


def _defaults(knob: Knob, held: Any) -> tuple[Any, ...]:
    try:
        return knob.defaults(held)
    except ValueError as exc:
        raise ModelError(str(exc)) from None
