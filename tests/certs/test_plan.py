"""gpushare-certs install/rotate/signing-key decisions, over an in-memory cluster (no API server)."""

from __future__ import annotations

import base64
import datetime
import subprocess
import sys

import pytest
from cryptography import x509

from certs import commands
from certs.build import Issued, build_ca, build_serving_cert
from certs.cluster import ClusterError, ca_bundle_patch, configuration_from
from certs.commands import Run, Target
from certs.plan import (
    CA_SECRET,
    SIGNING_SECRET,
    TLS_SECRET,
    VERIFY_CONFIGMAP,
    CaState,
    PlanError,
    Stored,
    WebhookConfiguration,
    bundle_certs,
    bundle_needs_update,
    ca_data,
    parse_ca_state,
    pem,
    serving_problem,
)
from tests.harness.apiserver.certs_cluster import FakeCluster

pytestmark = pytest.mark.timeout(60)

NOW = datetime.datetime(2026, 6, 1, tzinfo=datetime.UTC)
NS = "gpushare-system"
CA = build_ca(NOW)
OTHER_CA = build_ca(NOW)


def run(cluster: FakeCluster, lines: list[str] | None = None, now: datetime.datetime = NOW) -> Run:
    out = lines if lines is not None else []
    return Run(cluster, Target(), now, out.append)


def no_wait(what: str, seconds: float) -> None:
    del what, seconds


def trusted(cluster: FakeCluster, kind: str = "ValidatingWebhookConfiguration") -> list[x509.Certificate]:
    config = cluster.configurations[kind]
    return bundle_certs(config.ca_bundles[0][1])


def served_by(cluster: FakeCluster) -> x509.Certificate:
    return x509.load_pem_x509_certificate(cluster.secrets[(NS, TLS_SECRET)][0]["tls.crt"])


@pytest.mark.parametrize(
    ("serving", "ca", "now", "problem"),
    [
        (None, CA, NOW, "no readable serving certificate"),
        (build_serving_cert(CA, NOW), CA, NOW, None),
        (build_serving_cert(CA, NOW), OTHER_CA, NOW, "not issued by the CA"),
        (build_serving_cert(CA, NOW, service="other"), CA, NOW, "does not name gpushare-webhook,"),
        (build_serving_cert(CA, NOW, days=20), CA, NOW, "expires on"),
        (build_serving_cert(CA, NOW), CA, NOW + datetime.timedelta(days=340), "expires on"),
    ],
)
def test_serving_problem(serving: Issued | None, ca: Issued, now: datetime.datetime, problem: str | None) -> None:
    found = serving_problem(serving, ca.cert, now)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


def config(bundle: bytes, *more: bytes) -> WebhookConfiguration:
    hooks = (("a.gpushare.io", bundle), *((f"h{i}", b) for i, b in enumerate(more)))
    return WebhookConfiguration("ValidatingWebhookConfiguration", "gpushare-webhook", {}, hooks)


@pytest.mark.parametrize(
    ("configuration", "trust", "needed"),
    [
        (config(b""), [CA.cert], True),
        (config(b"not pem"), [CA.cert], True),
        (config(pem([CA.cert])), [CA.cert], False),
        (config(pem([CA.cert, OTHER_CA.cert])), [CA.cert], True),
        (config(pem([OTHER_CA.cert, CA.cert])), [CA.cert, OTHER_CA.cert], False),
        (config(pem([CA.cert]), b""), [CA.cert], True),
        (WebhookConfiguration("ValidatingWebhookConfiguration", "x", {}, ()), [CA.cert], False),
    ],
)
def test_bundle_needs_update(configuration: WebhookConfiguration, trust: list[x509.Certificate], needed: bool) -> None:
    assert bundle_needs_update(configuration, trust) is needed


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"ca.crt": CA.cert_pem}, "lacks ca.crt or ca.key"),
        ({"ca.crt": b"junk", "ca.key": CA.key_pem}, "does not hold a PEM certificate"),
        ({"ca.crt": CA.cert_pem, "ca.key": OTHER_CA.key_pem}, "do not belong together"),
    ],
)
def test_unusable_ca_secret_is_named(data: dict[str, bytes], message: str) -> None:
    with pytest.raises(PlanError, match=message) as caught:
        parse_ca_state(Stored(data, "1"), NS)
    assert f"Secret {NS}/{CA_SECRET}" in str(caught.value)


def test_ca_state_round_trips_with_next() -> None:
    state = parse_ca_state(Stored(ca_data(CaState(CA, OTHER_CA)), "1"), NS)
    assert state is not None and state.next is not None
    assert state.trusted == [CA.cert, OTHER_CA.cert]


def test_ca_bundle_patch_tests_each_webhook_name() -> None:
    obj = {"kind": "MutatingWebhookConfiguration", "metadata": {"name": "gpushare-webhook"},
           "webhooks": [{"name": "mutate.gpushare.io", "clientConfig": {"caBundle": base64.b64encode(b"x").decode()}},
                        {"name": "b.gpushare.io", "clientConfig": {"caBundle": "%%%"}}]}
    parsed = configuration_from(obj)
    assert parsed.ca_bundles == (("mutate.gpushare.io", b"x"), ("b.gpushare.io", b""))
    ops = ca_bundle_patch(parsed, b"PEM")
    assert ops == [
        {"op": "test", "path": "/webhooks/0/name", "value": "mutate.gpushare.io"},
        {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": base64.b64encode(b"PEM").decode()},
        {"op": "test", "path": "/webhooks/1/name", "value": "b.gpushare.io"},
        {"op": "add", "path": "/webhooks/1/clientConfig/caBundle", "value": base64.b64encode(b"PEM").decode()},
    ]


def test_install_writes_everything_and_is_idempotent() -> None:
    cluster = FakeCluster()
    cluster.add_configurations()
    lines: list[str] = []
    assert commands.install(run(cluster, lines)) == []
    assert NS in cluster.namespaces
    assert {name for _, name in cluster.secrets} == {CA_SECRET, TLS_SECRET, SIGNING_SECRET}
    assert cluster.secrets[(NS, TLS_SECRET)][1] == "kubernetes.io/tls"
    assert set(cluster.configmaps[(NS, VERIFY_CONFIGMAP)]) == {"signing.pub"}
    ca = x509.load_pem_x509_certificate(cluster.secrets[(NS, CA_SECRET)][0]["ca.crt"])
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        assert trusted(cluster, kind) == [ca]
    served_by(cluster).verify_directly_issued_by(ca)
    writes = len(cluster.writes)
    assert commands.install(run(cluster)) == []
    assert len(cluster.writes) == writes, "a second install must change nothing"


def test_install_before_the_configurations_exist_reports_them() -> None:
    cluster = FakeCluster()
    assert commands.install(run(cluster)) == ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]
    cluster.add_configurations()
    before = dict(cluster.secrets)
    assert commands.install(run(cluster)) == []
    assert cluster.secrets == before  # the keys are kept; only caBundle is set
    assert len(trusted(cluster)) == 1


def test_install_renews_an_expiring_serving_certificate() -> None:
    cluster = FakeCluster()
    cluster.add_configurations()
    commands.install(run(cluster))
    first = served_by(cluster)
    lines: list[str] = []
    commands.install(run(cluster, lines, now=NOW + datetime.timedelta(days=350)))
    assert served_by(cluster).serial_number != first.serial_number
    assert any("expires on" in line for line in lines)


def test_install_with_extra_hosts_reissues_until_they_are_named() -> None:
    cluster = FakeCluster()
    cluster.add_configurations()
    commands.install(run(cluster))
    lines: list[str] = []
    commands.install(Run(cluster, Target(extra_hosts=("127.0.0.1", "webhook.example")), NOW, lines.append))
    names = served_by(cluster).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "webhook.example" in names.get_values_for_type(x509.DNSName)
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert any("does not name 127.0.0.1, webhook.example" in line for line in lines)
    writes = len(cluster.writes)
    commands.install(Run(cluster, Target(extra_hosts=("127.0.0.1", "webhook.example")), NOW, lines.append))
    assert len(cluster.writes) == writes, "a certificate that names every host stays"


def test_install_refuses_configurations_managed_by_cert_manager() -> None:
    cluster = FakeCluster()
    cluster.add_configurations({"cert-manager.io/inject-ca-from": f"{NS}/gpushare-webhook"})
    with pytest.raises(PlanError, match="gets its caBundle from cert-manager"):
        commands.install(run(cluster))
    assert cluster.writes == []


def test_rotate_needs_an_install() -> None:
    with pytest.raises(PlanError, match="gpushare-certs install"):
        commands.rotate(run(FakeCluster()), no_wait)


def test_rotate_same_ca_keeps_trust_and_replaces_the_certificate() -> None:
    cluster = FakeCluster()
    cluster.add_configurations()
    commands.install(run(cluster))
    before = served_by(cluster)
    bundle = trusted(cluster)
    commands.rotate(run(cluster), no_wait)
    after = served_by(cluster)
    assert after.serial_number != before.serial_number
    assert trusted(cluster) == bundle
    after.verify_directly_issued_by(bundle[0])


def test_rotate_new_ca_trusts_both_before_switching_and_drops_the_old_one_last() -> None:
    cluster = FakeCluster()
    cluster.add_configurations()
    commands.install(run(cluster))
    old = trusted(cluster)[0]
    seen: list[tuple[str, int, bool]] = []

    def settle(what: str, seconds: float) -> None:
        # What a replica may serve at each wait must be trusted by the caBundle the API server holds.
        bundle = trusted(cluster)
        serving = served_by(cluster)
        seen.append((what, len(bundle), any(_issued(serving, ca) for ca in bundle)))
        assert seconds >= 0

    commands.rotate(run(cluster), settle, new_ca=True, overlap_seconds=120)
    assert seen == [
        ("the API servers to load the caBundle that trusts both CAs", 2, True),
        ("every webhook replica to load the certificate from the new CA", 2, True),
    ]
    final = trusted(cluster)
    assert len(final) == 1 and final[0] != old
    served_by(cluster).verify_directly_issued_by(final[0])
    assert set(cluster.secrets[(NS, CA_SECRET)][0]) == {"ca.crt", "ca.key"}


def _issued(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except Exception:
        return False
    return True


@pytest.mark.parametrize("fail_at", range(9))
def test_an_interrupted_ca_rotation_resumes_with_the_same_next_ca(fail_at: int) -> None:
    cluster = FakeCluster()
    cluster.add_configurations()
    commands.install(run(cluster))
    cluster.writes.clear()
    cluster.fail_after_writes = fail_at
    with pytest.raises(ClusterError):
        commands.rotate(run(cluster), no_wait, new_ca=True)
    cluster.fail_after_writes = None
    ca_secret = cluster.secrets[(NS, CA_SECRET)][0]
    pending = ca_secret.get("next-ca.crt")
    commands.rotate(run(cluster), no_wait, new_ca=True)
    final = cluster.secrets[(NS, CA_SECRET)][0]
    assert set(final) == {"ca.crt", "ca.key"}
    if pending is not None:
        assert final["ca.crt"] == pending, "the resumed rotation must finish with the CA it started"
    assert trusted(cluster) == [x509.load_pem_x509_certificate(final["ca.crt"])]
    served_by(cluster).verify_directly_issued_by(trusted(cluster)[0])


def test_same_ca_rotation_is_refused_during_a_ca_rotation() -> None:
    cluster = FakeCluster()
    cluster.add_configurations()
    commands.install(run(cluster))
    cluster.fail_after_writes = len(cluster.writes) + 1  # the next CA is recorded, then the connection drops
    with pytest.raises(ClusterError):
        commands.rotate(run(cluster), no_wait, new_ca=True)
    cluster.fail_after_writes = None
    with pytest.raises(PlanError, match="rotation is in progress"):
        commands.rotate(run(cluster), no_wait)
    with pytest.raises(PlanError, match="rotation is in progress"):
        commands.install(run(cluster))


def test_signing_key_creates_once_and_keeps_the_pair() -> None:
    cluster = FakeCluster(namespaces={NS})
    commands.signing_key(run(cluster))
    pair = (dict(cluster.secrets[(NS, SIGNING_SECRET)][0]), dict(cluster.configmaps[(NS, VERIFY_CONFIGMAP)]))
    commands.signing_key(run(cluster))
    assert (cluster.secrets[(NS, SIGNING_SECRET)][0], cluster.configmaps[(NS, VERIFY_CONFIGMAP)]) == pair
    del cluster.configmaps[(NS, VERIFY_CONFIGMAP)]
    commands.signing_key(run(cluster))
    assert cluster.configmaps[(NS, VERIFY_CONFIGMAP)] == pair[1], "the public key is derived from the Secret again"


@pytest.mark.parametrize(
    ("orphan", "message"),
    [("configmap", "its private key is lost"), ("mismatch", "holds a different public key")],
)
def test_signing_key_without_update_rights_explains_the_fix(orphan: str, message: str) -> None:
    cluster = FakeCluster(namespaces={NS})
    commands.signing_key(run(cluster))
    if orphan == "configmap":
        del cluster.secrets[(NS, SIGNING_SECRET)]
    else:
        cluster.configmaps[(NS, VERIFY_CONFIGMAP)] = {"signing.pub": b"-----BEGIN PUBLIC KEY-----\nother\n"}
    with pytest.raises(PlanError, match=message) as caught:
        commands.signing_key(run(cluster))
    assert "delete the ConfigMap" in str(caught.value)


def test_install_repairs_a_mismatched_public_key() -> None:
    cluster = FakeCluster(namespaces={NS})
    commands.signing_key(run(cluster))
    cluster.configmaps[(NS, VERIFY_CONFIGMAP)] = {"signing.pub": b"-----BEGIN PUBLIC KEY-----\nother\n"}
    commands.install(run(cluster))  # install may update the ConfigMap, so it publishes the Secret's key again
    commands.signing_key(run(cluster))


def test_plan_and_commands_import_no_kubernetes_client() -> None:
    probe = (
        "import sys, certs.plan, certs.commands, certs.cli\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] == 'kubernetes')))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == ""
