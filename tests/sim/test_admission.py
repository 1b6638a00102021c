"""The admission chain of the test API server against a scriptable HTTPS webhook."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from tests.harness.apiserver.auth import service_account, user
from tests.harness.apiserver.client import SimClient
from tests.harness.apiserver.fakehook import POD_RULE, FakeWebhook, configuration, review, webhook
from tests.harness.apiserver.resources import PODS
from tests.harness.apiserver.server import ApiServer
from tests.harness.apiserver.status import ApiError
from tests.harness.tls import Authority

pytestmark = pytest.mark.timeout(60)

Obj = dict[str, Any]


def pod(name: str = "p", **annotations: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "demo"}, "annotations": dict(annotations)},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}


def install(api: ApiServer, *configs: Obj) -> None:
    for config in configs:
        key = "mutatingwebhookconfigurations" if config["kind"].startswith("Mutating") else \
            "validatingwebhookconfigurations"
        api.client().create(f"{key}.admissionregistration.k8s.io", config)


def test_mutating_patch_is_applied_and_review_is_complete(api: ApiServer, hook: FakeWebhook,
                                                           authority: Authority) -> None:
    hook.responder = lambda path, req: review(req, patch=[{"op": "add", "path": "/metadata/labels/stamped",
                                                             "value": "yes"}])
    install(api, configuration("Mutating", "m", webhook("mutate.test", "/mutate", authority.cert_pem)))
    token = api.add_user(user("alice", "devs"))
    created = api.client(token).create_pod("default", {**pod(), "metadata": {"generateName": "web-", "labels": {}}})
    assert created["metadata"]["labels"] == {"stamped": "yes"}
    assert created["metadata"]["name"].startswith("web-")
    [(path, request)] = hook.calls
    assert path == "/mutate"
    assert request["operation"] == "CREATE"
    assert request["kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert request["resource"] == {"group": "", "version": "v1", "resource": "pods"}
    assert request["userInfo"] == {"username": "alice", "groups": ["devs", "system:authenticated"]}
    assert request["name"] == "" and "uid" not in request["object"]["metadata"]  # generateName: no name yet
    assert request["oldObject"] is None
    assert request["namespace"] == "default"
    assert request["options"]["kind"] == "CreateOptions"
    assert request["dryRun"] is False


def test_validating_sees_generated_name_and_uid(api: ApiServer, hook: FakeWebhook, authority: Authority) -> None:
    install(api, configuration("Validating", "v", webhook("validate.test", "/validate", authority.cert_pem)))
    created = api.client().create_pod("default", {**pod(), "metadata": {"generateName": "web-"}})
    [(_, request)] = hook.calls
    assert request["name"] == created["metadata"]["name"]
    assert request["object"]["metadata"]["uid"] == created["metadata"]["uid"]


def test_fresh_uid_per_call(api: ApiServer, hook: FakeWebhook, authority: Authority, admin: SimClient) -> None:
    install(api, configuration("Validating", "v", webhook("validate.test", "/validate", authority.cert_pem)))
    admin.create_pod("default", pod("a"))
    admin.create_pod("default", pod("b"))
    uids = {request["uid"] for _, request in hook.calls}
    assert len(uids) == 2


@pytest.mark.parametrize(
    ("status", "code", "message"),
    [
        ({"message": "no GPU index for you", "code": 403}, 403,
         'admission webhook "validate.test" denied the request: no GPU index for you'),
        ({"message": "bad annotation"}, 400, 'admission webhook "validate.test" denied the request: bad annotation'),
        ({"code": 200, "reason": "Nope"}, 400, 'admission webhook "validate.test" denied the request: Nope'),
        ({}, 400, 'admission webhook "validate.test" denied the request without explanation'),
        ({"code": 422, "message": "x"}, 422, 'admission webhook "validate.test" denied the request: x'),
    ],
)
def test_denial_reaches_client_like_the_real_server(api: ApiServer, hook: FakeWebhook, authority: Authority,
                                                     admin: SimClient, status: Obj, code: int, message: str) -> None:
    hook.responder = lambda path, req: review(req, False, status=status)
    install(api, configuration("Validating", "v", webhook("validate.test", "/validate", authority.cert_pem)))
    with pytest.raises(ApiError) as caught:
        admin.create_pod("default", pod())
    assert (caught.value.code, caught.value.message) == (code, message)
    assert admin.get_pod("default", "p") is None


def _bad_uid(path: str, req: Obj) -> Obj:
    return review({**req, "uid": "not-the-uid"})


def _bad_version(path: str, req: Obj) -> Obj:
    return {**review(req), "apiVersion": "admission.k8s.io/v1beta1"}


def _bad_kind(path: str, req: Obj) -> Obj:
    return {**review(req), "kind": "Pod"}


def _no_response(path: str, req: Obj) -> Obj:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}


def _not_json(path: str, req: Obj) -> bytes:
    return b"<html>oops</html>"


@pytest.mark.parametrize(
    ("responder", "reason"),
    [
        (_bad_uid, 'expected response.uid="'),
        (_bad_version, "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview"),
        (_bad_kind, "Kind=Pod"),
        (_no_response, "webhook response was absent"),
        (_not_json, "the body is not JSON"),
    ],
)
@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
def test_bad_answers_are_failed_calls_and_failure_policy_decides(
    api: ApiServer, hook: FakeWebhook, authority: Authority, admin: SimClient, responder: Any, reason: str,
    policy: str,
) -> None:
    hook.responder = responder
    install(api, configuration("Validating", "v", webhook("validate.test", "/validate", authority.cert_pem,
                                                          failurePolicy=policy)))
    if policy == "Ignore":
        assert admin.create_pod("default", pod())["metadata"]["name"] == "p"
        return
    with pytest.raises(ApiError) as caught:
        admin.create_pod("default", pod())
    assert caught.value.code == 500
    assert caught.value.message.startswith('Internal error occurred: failed calling webhook "validate.test": ')
    assert reason in caught.value.message


def test_untrusted_certificate_is_a_failed_call(api: ApiServer, authority: Authority, admin: SimClient) -> None:
    other = Authority("someone-else")
    install(api, configuration("Validating", "v", webhook("validate.test", "/validate", other.cert_pem)))
    with pytest.raises(ApiError) as caught:
        admin.create_pod("default", pod())
    assert caught.value.code == 500
    assert "failed to verify certificate" in caught.value.message
    assert "https://gpushare-webhook.gpushare-system.svc:443/validate" in caught.value.message


def test_certificate_must_name_the_service(api: ApiServer, hook: FakeWebhook, authority: Authority,
                                           admin: SimClient) -> None:
    """The certificate is for gpushare-webhook.gpushare-system.svc; a Service of another name fails TLS."""
    api.add_service("gpushare-system", "other", 443, hook.url)
    install(api, configuration("Validating", "v", webhook("validate.test", "/validate", authority.cert_pem,
                                                          service="other")))
    with pytest.raises(ApiError) as caught:
        admin.create_pod("default", pod())
    assert "failed to verify certificate" in caught.value.message


def test_unknown_service_and_webhook_down(api: ApiServer, hook: FakeWebhook, authority: Authority,
                                          admin: SimClient) -> None:
    install(api, configuration("Validating", "v", webhook("validate.test", "/validate", authority.cert_pem,
                                                          service="missing")))
    with pytest.raises(ApiError) as caught:
        admin.create_pod("default", pod())
    assert "no such host" in caught.value.message
    hook.stop()
    api.client().delete("validatingwebhookconfigurations.admissionregistration.k8s.io", "v")
    install(api, configuration("Validating", "v", webhook("validate.test", "/validate", authority.cert_pem)))
    with pytest.raises(ApiError) as caught:
        admin.create_pod("default", pod())
    assert caught.value.code == 500
    assert 'failed calling webhook "validate.test": failed to call webhook: Post' in caught.value.message


def test_client_config_url(api: ApiServer, hook: FakeWebhook, authority: Authority, admin: SimClient) -> None:
    entry = webhook("validate.test", "/validate", authority.cert_pem)
    entry["clientConfig"] = {"url": hook.url + "/by-url", "caBundle": entry["clientConfig"]["caBundle"]}
    install(api, configuration("Validating", "v", entry))
    admin.create_pod("default", pod())
    assert hook.paths() == ["/by-url"]


def test_timeout_is_a_failed_call(api: ApiServer, hook: FakeWebhook, authority: Authority, admin: SimClient) -> None:
    hook.delay = 1.5
    install(api, configuration("Validating", "v", webhook("validate.test", "/validate", authority.cert_pem,
                                                          timeoutSeconds=1)))
    with pytest.raises(ApiError) as caught:
        admin.create_pod("default", pod())
    assert "context deadline exceeded" in caught.value.message


def test_mutating_runs_before_validating_in_name_order(api: ApiServer, hook: FakeWebhook, authority: Authority,
                                                       admin: SimClient) -> None:
    ca = authority.cert_pem
    install(
        api,
        configuration("Validating", "a-validating", webhook("v1.test", "/v1", ca)),
        configuration("Mutating", "z-mutating", webhook("m3.test", "/m3", ca)),
        configuration("Mutating", "b-mutating", webhook("m1.test", "/m1", ca), webhook("m2.test", "/m2", ca)),
    )
    admin.create_pod("default", pod())
    assert hook.paths() == ["/m1", "/m2", "/m3", "/v1"]


def test_reinvocation_if_needed(api: ApiServer, hook: FakeWebhook, authority: Authority, admin: SimClient) -> None:
    """m1 (IfNeeded) runs again after m2 changed the object; m2 (Never) does not."""
    def responder(path: str, req: Obj) -> Obj:
        labels = req["object"]["metadata"].get("labels") or {}
        if path == "/m2" and "m2" not in labels:
            return review(req, patch=[{"op": "add", "path": "/metadata/labels/m2", "value": "x"}])
        if path == "/m1":
            seen = ",".join(sorted(labels))
            return review(req, patch=[{"op": "add", "path": "/metadata/annotations/m1-saw", "value": seen}])
        return review(req)

    hook.responder = responder
    ca = authority.cert_pem
    install(api, configuration("Mutating", "m", webhook("m1.test", "/m1", ca, reinvocationPolicy="IfNeeded"),
                               webhook("m2.test", "/m2", ca, reinvocationPolicy="Never")))
    created = admin.create_pod("default", pod())
    assert hook.paths() == ["/m1", "/m2", "/m1"]
    assert created["metadata"]["annotations"]["m1-saw"] == "app,m2"


def test_no_reinvocation_without_a_later_change(api: ApiServer, hook: FakeWebhook, authority: Authority,
                                                admin: SimClient) -> None:
    ca = authority.cert_pem
    install(api, configuration("Mutating", "m", webhook("m1.test", "/m1", ca, reinvocationPolicy="IfNeeded"),
                               webhook("m2.test", "/m2", ca)))
    admin.create_pod("default", pod())
    assert hook.paths() == ["/m1", "/m2"]


def test_update_sends_old_object_and_patch_is_an_update(api: ApiServer, hook: FakeWebhook, authority: Authority,
                                                        admin: SimClient) -> None:
    admin.create_pod("default", pod())
    install(api, configuration("Validating", "v", webhook("validate.test", "/validate", authority.cert_pem)))
    admin.patch_pod("default", "p", {"metadata": {"annotations": {"k": "v"}}})
    [(_, request)] = hook.calls
    assert request["operation"] == "UPDATE"
    assert request["options"]["kind"] == "UpdateOptions"
    assert request["oldObject"]["metadata"]["annotations"] == {}
    assert request["object"]["metadata"]["annotations"] == {"k": "v"}


def test_update_denied_leaves_object_alone(api: ApiServer, hook: FakeWebhook, authority: Authority,
                                           admin: SimClient) -> None:
    admin.create_pod("default", pod())
    hook.responder = lambda path, req: review(req, False, status={"message": "no", "code": 403})
    install(api, configuration("Validating", "v", webhook("validate.test", "/validate", authority.cert_pem)))
    with pytest.raises(ApiError) as caught:
        admin.patch_pod("default", "p", {"metadata": {"annotations": {"k": "v"}}})
    assert caught.value.code == 403
    assert admin.get("pods", "p", "default")["metadata"]["annotations"] == {}


def test_binding_subresource_admission(api: ApiServer, hook: FakeWebhook, authority: Authority,
                                       admin: SimClient) -> None:
    admin.create_pod("default", pod())
    rule = {**POD_RULE, "operations": ["CREATE"], "resources": ["pods/binding"]}
    install(api, configuration("Validating", "v", webhook("validate.test", "/validate", authority.cert_pem,
                                                          rules=[rule])))
    extender = api.client(api.add_user(service_account("kube-system", "gpushare-schd-extender")))
    extender.bind("default", "p", "node-1", {"ALIYUN_COM_GPU_MEM_IDX": "2"})
    [(_, request)] = hook.calls
    assert request["kind"]["kind"] == "Binding"
    assert request["subResource"] == "binding"
    assert request["name"] == "p"
    assert request["object"]["target"]["name"] == "node-1"
    assert request["userInfo"]["username"] == "system:serviceaccount:kube-system:gpushare-schd-extender"
    bound = admin.get("pods", "p", "default")
    assert bound["spec"]["nodeName"] == "node-1"
    assert bound["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_IDX"] == "2"


def test_delete_admission(api: ApiServer, hook: FakeWebhook, authority: Authority, admin: SimClient) -> None:
    admin.create_pod("default", pod())
    rule = {**POD_RULE, "operations": ["DELETE"]}
    hook.responder = lambda path, req: review(req, False, status={"message": "keep it", "code": 403})
    install(api, configuration("Validating", "v", webhook("validate.test", "/validate", authority.cert_pem,
                                                          rules=[rule])))
    with pytest.raises(ApiError, match="keep it"):
        admin.delete_pod("default", "p")
    [(_, request)] = hook.calls
    assert request["operation"] == "DELETE"
    assert request["object"] is None
    assert request["oldObject"]["metadata"]["name"] == "p"
    assert request["options"]["kind"] == "DeleteOptions"


def test_warnings_do_not_block(api: ApiServer, hook: FakeWebhook, authority: Authority, admin: SimClient) -> None:
    hook.responder = lambda path, req: review(req, warnings=["careful"])
    install(api, configuration("Validating", "v", webhook("validate.test", "/validate", authority.cert_pem)))
    assert admin.create_pod("default", pod())["metadata"]["name"] == "p"
    assert admin.warnings == ["careful"]


def test_unappliable_patch_is_an_internal_error(api: ApiServer, hook: FakeWebhook, authority: Authority,
                                                admin: SimClient) -> None:
    hook.responder = lambda path, req: review(req, patch=[{"op": "remove", "path": "/no/such"}])
    install(api, configuration("Mutating", "m", webhook("mutate.test", "/mutate", authority.cert_pem,
                                                        failurePolicy="Ignore")))
    with pytest.raises(ApiError) as caught:
        admin.create_pod("default", pod())
    assert caught.value.code == 500
    assert "cannot be applied" in caught.value.message


def test_validating_webhook_may_not_patch(api: ApiServer, hook: FakeWebhook, authority: Authority,
                                          admin: SimClient) -> None:
    hook.responder = lambda path, req: review(req, patch=[])
    install(api, configuration("Validating", "v", webhook("validate.test", "/validate", authority.cert_pem)))
    with pytest.raises(ApiError, match="validating webhooks may not return patches"):
        admin.create_pod("default", pod())


def test_ca_bundle_can_be_patched_in(api: ApiServer, hook: FakeWebhook, authority: Authority,
                                     admin: SimClient) -> None:
    """Like the certs CLI: install without caBundle (calls fail), then patch it in (calls succeed)."""
    entry = webhook("validate.test", "/validate", authority.cert_pem)
    del entry["clientConfig"]["caBundle"]
    install(api, configuration("Validating", "v", entry))
    with pytest.raises(ApiError, match="failed to verify certificate"):
        admin.create_pod("default", pod())
    key = "validatingwebhookconfigurations.admissionregistration.k8s.io"
    bundle = base64.b64encode(authority.cert_pem).decode()
    admin.patch(key, "v", [{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": bundle}],
                patch_type="json")
    assert admin.create_pod("default", pod())["metadata"]["name"] == "p"
    assert PODS.kind == "Pod"
