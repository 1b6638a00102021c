"""The chart generator keeps what it can express and refuses, naming the field, what it cannot."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from charts import generate, model, release
from charts.helpers import helpers
from charts.knobs import KNOBS, MANIFEST_LABELS, TRUSTED_NAMESPACES, split_image
from charts.model import Knobbed, ModelError, When, merge
from charts.values import TABLE_BEGIN, TABLE_END, docs

CM, SS = 'eq .Values.certificates "cert-manager"', 'eq .Values.certificates "self-signed"'


@pytest.mark.parametrize(("base", "variant", "merged"), [
    ({"a": 1}, {"a": 1}, {"a": 1}),
    ({"metadata": {"name": "x"}}, {"metadata": {"name": "x", "annotations": {"k": "v"}}},
     {"metadata": {"name": "x", "annotations": When(CM, {"k": "v"})}}),
    ({"data": {"a": "1", "b": "2"}}, {"data": {"a": "1"}}, {"data": {"a": "1", "b": When(SS, "2")}}),
])
def test_merge_keeps_added_and_removed_keys_under_their_condition(base: Any, variant: Any, merged: Any) -> None:
    assert merge(base, variant, CM, SS, "X") == merged


def test_merge_keeps_added_named_list_items_in_place() -> None:
    base = {"ports": [{"name": "https", "containerPort": 8443}, {"name": "z", "containerPort": 1}]}
    variant = {"ports": [{"name": "https", "containerPort": 8443}, {"name": "metrics", "containerPort": 9100},
                         {"name": "z", "containerPort": 1}]}
    assert merge(base, variant, CM, SS, "X") == {"ports": [
        {"name": "https", "containerPort": 8443}, When(CM, {"name": "metrics", "containerPort": 9100}),
        {"name": "z", "containerPort": 1}]}


@pytest.mark.parametrize(("base", "variant", "named"), [
    ({"spec": {"replicas": 2}}, {"spec": {"replicas": 3}}, "X.spec.replicas"),
    ({"items": [1, 2]}, {"items": [1, 3]}, "X.items"),
    ({"env": [{"name": "A", "value": "1"}]}, {"env": [{"name": "A", "value": "2"}]}, "X.env[name=A].value"),
    ({"env": [{"name": "A"}, {"name": "B"}]}, {"env": [{"name": "B"}, {"name": "A"}]}, "X.env"),
])
def test_merge_refuses_a_field_the_renders_set_differently(base: Any, variant: Any, named: str) -> None:
    with pytest.raises(ModelError, match=re.escape(named)):
        merge(base, variant, CM, SS, "X")


def test_a_conditional_key_becomes_an_if_block_that_renders_like_the_source() -> None:
    obj = {"metadata": {"name": "x", "annotations": When(CM, {"k": "v"})}, "spec": {"a": 1}}
    text = generate._Writer({}).text(obj)
    lines = text.splitlines()
    block = [f"  {{{{- if {CM} }}}}", "  annotations:", "    k: v", "  {{- end }}"]
    start = lines.index(block[0])
    assert lines[start:start + 4] == block
    # With the condition's lines left out (false) or kept (true), the text is the object without or with the key.
    without = "\n".join(line for line in lines if "{{" not in line and "k: v" not in line
                        and "annotations" not in line)
    assert yaml.safe_load(without) == {"metadata": {"name": "x"}, "spec": {"a": 1}}
    assert yaml.safe_load("\n".join(line for line in lines if "{{" not in line)) == {
        "metadata": {"name": "x", "annotations": {"k": "v"}}, "spec": {"a": 1}}


def test_a_conditional_list_item_renders_like_the_source() -> None:
    obj = {"spec": {"ports": [{"name": "https"}, When(CM, {"name": "metrics", "port": 9100}), {"name": "z"}]}}
    lines = generate._Writer({}).text(obj).splitlines()
    block = ["  {{- if " + CM + " }}", "  - name: metrics", "    port: 9100", "  {{- end }}"]
    start = lines.index(block[0])
    assert lines[start:start + 4] == block
    kept = yaml.safe_load("\n".join(line for line in lines if "{{" not in line))
    dropped = yaml.safe_load("\n".join(line for i, line in enumerate(lines) if not start <= i < start + 4))
    assert kept == {"spec": {"ports": [{"name": "https"}, {"name": "metrics", "port": 9100}, {"name": "z"}]}}
    assert dropped == {"spec": {"ports": [{"name": "https"}, {"name": "z"}]}}


def test_a_template_action_in_the_manifests_is_refused() -> None:
    with pytest.raises(ModelError, match="Helm would read as a template action"):
        generate._Writer({}).text({"data": {"x": "{{ .Values.secret }}"}})


def test_knob_fields_become_value_expressions() -> None:
    index = next(i for i, k in enumerate(KNOBS) if k.values[0].path == "webhook.replicas")
    text = generate._Writer({"webhook.replicas": 2}).text({"spec": {"replicas": Knobbed(index)}})
    assert "replicas: {{ .Values.webhook.replicas }}" in text


def test_a_knob_that_keeps_the_first_items_sets_the_rest() -> None:
    index = KNOBS.index(TRUSTED_NAMESPACES)
    lists = [["gpushare-system", "kube-system"], ["gpushare-system", "kube-system"]]
    assert model._append(TRUSTED_NAMESPACES, index, lists) == ["kube-system"]  # the value's default
    assert lists == [["gpushare-system", Knobbed(index)]] * 2
    lines = generate._Writer({}).text({"values": lists[0]}).splitlines()
    assert lines == ["values:", "- gpushare-system", "{{- with .Values.trustedNamespaces }}",
                     "{{- toYaml . | nindent 0 }}", "{{- end }}"]


@pytest.mark.parametrize("lists", [
    [["gpushare-system", "kube-system"], ["gpushare-system"]],
    [["gpushare-system", "kube-system"], ["kube-system", "gpushare-system"]],
    [[]],
])
def test_a_knob_that_keeps_the_first_items_needs_one_list(lists: list[list[str]]) -> None:
    with pytest.raises(ModelError, match="trustedNamespaces sets the items after the first 1 of"):
        model._append(TRUSTED_NAMESPACES, KNOBS.index(TRUSTED_NAMESPACES), lists)


def test_a_path_step_may_name_an_item_whose_name_holds_dots() -> None:
    hooks = {"webhooks": [{"name": "mutate.gpushare.io", "timeoutSeconds": 5},
                          {"name": "neutralise.gpushare.io", "timeoutSeconds": 2}]}
    [(parent, key)] = model._fields(hooks, "webhooks[name=neutralise.gpushare.io].timeoutSeconds")
    assert parent[key] == 2


@pytest.mark.parametrize(("image", "parts"), [
    ("gpushare:0.1.0", ("gpushare", "0.1.0")),
    ("registry.example:5000/team/gpushare:1.2", ("registry.example:5000/team/gpushare", "1.2")),
])
def test_split_image(image: str, parts: tuple[str, str]) -> None:
    assert split_image(image) == parts


@pytest.mark.parametrize("image", ["gpushare", "registry.example:5000/gpushare"])
def test_an_image_without_a_tag_is_refused(image: str) -> None:
    with pytest.raises(ValueError, match="has no tag"):
        split_image(image)


def test_a_component_the_cluster_decides_is_one_term_of_every_condition() -> None:
    condition = model.component_condition("in-process")
    assert condition == '(eq (include "gpushare.inProcess.enabled" .) "true")'
    assert f"not {condition}" == 'not (eq (include "gpushare.inProcess.enabled" .) "true")'
    gated = model.both(condition, 'eq .Values.config.delivery "env"')
    assert gated == f'and {condition} (eq .Values.config.delivery "env")'
    assert model.both(None, 'eq .Values.config.delivery "env"') == 'eq .Values.config.delivery "env"'
    assert model.both(".Values.dra.enabled", ".Values.networkPolicy.enabled") == (
        "and .Values.dra.enabled .Values.networkPolicy.enabled")


def test_a_component_may_change_an_object_the_certificate_modes_change_too() -> None:
    """The component's change and the mode's keep their own conditions: the mode's annotation, the component's
    removed entry."""
    base = {"metadata": {"name": "w"}, "webhooks": [{"name": "a"}, {"name": "b"}]}
    cm = {"metadata": {"name": "w", "annotations": {"k": "v"}}, "webhooks": [{"name": "a"}, {"name": "b"}]}
    by_mode = merge(base, cm, CM, SS, "X")
    component = merge({**base, "webhooks": [{"name": "a"}]}, {**cm, "webhooks": [{"name": "a"}]}, CM, SS, "X")
    on = '(eq (include "x" .) "true")'
    assert merge(by_mode, component, on, f"not {on}", "X") == {
        "metadata": {"name": "w", "annotations": When(CM, {"k": "v"})},
        "webhooks": [{"name": "a"}, When(f"not {on}", {"name": "b"})]}


def test_helpers_say_true_or_false_for_each_component_the_cluster_decides() -> None:
    text = helpers()
    assert '{{- define "gpushare.inProcess.enabled" -}}' in text
    assert '.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"' in text


def _knob(path: str) -> int:
    return next(i for i, k in enumerate(KNOBS) if any(v.path == path for v in k.values))


def _part(obj: dict[str, Any]) -> model.Part:
    return model.Part(obj, "manifests/base/x.yaml", None)


def _workload(**spec: Any) -> dict[str, Any]:
    labels = {label: "x" for label in MANIFEST_LABELS}
    return {"kind": "Deployment", "metadata": {"name": "gpushare-webhook", "labels": dict(labels)},
            "spec": {"template": {"metadata": {"labels": dict(labels)}, "spec": {"containers": [], **spec}}}}


@pytest.mark.parametrize(("value", "path", "text"), [
    ("webhook.nodeSelector", "nodeSelector",
     ["      {{- with .Values.webhook.nodeSelector }}", "      nodeSelector:",
      "        {{- toYaml . | nindent 8 }}", "      {{- end }}"]),
    ("imagePullSecrets", "imagePullSecrets",
     ["      {{- with .Values.imagePullSecrets }}", "      imagePullSecrets:",
      "        {{- toYaml . | nindent 8 }}", "      {{- end }}"]),
])
def test_a_field_the_manifests_lack_renders_only_while_its_value_is_set(value: str, path: str, text: list[str]) -> None:
    index = _knob(value)
    parts = [_part(_workload())]
    assert model._absent(KNOBS[index], index, parts) != []
    assert parts[0].obj["spec"]["template"]["spec"][path] == Knobbed(index)
    lines = generate._Writer({}).text(parts[0].obj).splitlines()
    start = lines.index(text[0])
    assert lines[start:start + 4] == text


def test_a_field_the_manifests_hold_is_not_added() -> None:
    index = _knob("webhook.nodeSelector")
    with pytest.raises(ModelError, match="hold already; drop `absent`"):
        model._absent(KNOBS[index], index, [_part(_workload(nodeSelector={"a": "b"}))])


def test_a_map_value_adds_its_entries_beside_the_manifests() -> None:
    index = _knob("webhook.podLabels")
    labels = {"app.kubernetes.io/name": "gpushare-webhook"}
    assert model._append(KNOBS[index], index, [labels]) == {}  # the value's default
    lines = generate._Writer({}).text({"labels": labels}).splitlines()
    assert lines == ["labels:", "  {{- with .Values.webhook.podLabels }}", "  {{- toYaml . | nindent 2 }}",
                     "  {{- end }}", "  app.kubernetes.io/name: gpushare-webhook"]


def test_release_fields_go_to_every_object_and_the_config_readers_pod_templates() -> None:
    reader = _workload()
    reader["spec"]["template"]["spec"]["containers"] = [{"name": "c", "envFrom": [
        {"configMapRef": {"name": "gpushare-config"}}]}]
    other = {"kind": "ServiceAccount", "metadata": {"name": "sa", "labels": {k: "x" for k in MANIFEST_LABELS}}}
    parts = [_part(reader), _part(other)]
    release.add_release_fields(parts)
    text = generate._Writer({}).text(reader)
    assert text.count('{{- include "gpushare.labels" $ | nindent') == 2
    assert '      annotations:\n        {{- include "gpushare.configChecksum" $ | nindent 8 }}' in text
    assert "annotations" not in generate._Writer({}).text(other)


def test_an_object_without_the_manifest_labels_is_refused() -> None:
    with pytest.raises(ModelError, match="lacks the labels"):
        release.add_release_fields([_part({"kind": "ConfigMap", "metadata": {"name": "c", "labels": {
            "app.kubernetes.io/part-of": "gpushare"}}})])


def test_the_namespace_object_is_rendered_unless_the_release_lives_in_it() -> None:
    text = generate.templates([_part({"kind": "Namespace", "metadata": {"name": "gpushare-system"}})], {})
    body = text["templates/x.yaml"].split("\n", 1)[1]
    assert body.startswith('{{- if ne .Release.Namespace "gpushare-system" }}\n---\n'), body
    assert body.endswith("{{- end }}\n"), body


@pytest.mark.parametrize("text", ["# Helm\n\nno table here\n", f"# Helm\n{TABLE_END}\n{TABLE_BEGIN}\n"])
def test_the_docs_need_the_markers_of_the_values_table(text: str) -> None:
    with pytest.raises(ModelError, match="lacks the lines"):
        docs(text, {})


def test_the_values_table_replaces_what_lies_between_its_markers_only() -> None:
    defaults: dict[str, Any] = {v.path: [] for knob in KNOBS for v in knob.values}
    text = docs(f"# Helm\n\nbefore\n\n{TABLE_BEGIN}\n| old | table |\n{TABLE_END}\n\nafter\n", defaults)
    assert text.startswith(f"# Helm\n\nbefore\n\n{TABLE_BEGIN}\n| value | default | meaning |\n")
    assert text.endswith(f"\n{TABLE_END}\n\nafter\n")
    assert "| old | table |" not in text
    assert "| `webhook.podLabels` | `[]` | Labels added to the webhook's pods" in text
