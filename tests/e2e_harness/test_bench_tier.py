"""The tier benchmark's reading of the API server's and the webhook's metrics (e2e/apimetrics.py)."""

from __future__ import annotations

from e2e.apimetrics import Reading, apiserver_series, counter, delta, sums

APISERVER = """\
# TYPE apiserver_request_duration_seconds histogram
apiserver_request_duration_seconds_sum{verb="POST",resource="pods",subresource="",scope="resource"} 2.0
apiserver_request_duration_seconds_count{verb="POST",resource="pods",subresource="",scope="resource"} 100
apiserver_request_duration_seconds_sum{verb="POST",resource="pods",subresource="binding",scope="resource"} 9.0
apiserver_request_duration_seconds_count{verb="POST",resource="pods",subresource="binding",scope="resource"} 9
apiserver_request_duration_seconds_sum{verb="GET",resource="pods",subresource="",scope="resource"} 5.0
apiserver_request_duration_seconds_count{verb="GET",resource="pods",subresource="",scope="resource"} 5
# TYPE apiserver_admission_webhook_admission_duration_seconds histogram
HOOK_sum{name="mutate.gpushare.io",operation="CREATE",rejected="false",type="admit"} 0.5
HOOK_count{name="mutate.gpushare.io",operation="CREATE",rejected="false",type="admit"} 100
HOOK_sum{name="mutate.gpushare.io",operation="UPDATE",rejected="false",type="admit"} 7.0
HOOK_count{name="mutate.gpushare.io",operation="UPDATE",rejected="false",type="admit"} 7
""".replace("HOOK", "apiserver_admission_webhook_admission_duration_seconds")
WEBHOOK = """\
# TYPE gpushare_webhook_tls_handshakes counter
gpushare_webhook_tls_handshakes_total{outcome="completed"} 4.0
gpushare_webhook_tls_handshakes_total{outcome="failed"} 1.0
"""


def test_only_post_pods_and_our_create_calls_are_read() -> None:
    read = sums(APISERVER, apiserver_series)
    assert read == {"POST pods": (2.0, 100.0), "mutate.gpushare.io": (0.5, 100.0)}
    assert counter(WEBHOOK, "gpushare_webhook_tls_handshakes_total", outcome="completed") == 4.0


def test_a_burst_is_the_difference_of_two_readings() -> None:
    before = Reading({"POST pods": (1.0, 50.0)}, handshakes=1, reviews=10)
    after = Reading({"POST pods": (2.0, 100.0), "mutate.gpushare.io": (0.5, 100.0)}, handshakes=4, reviews=110)
    burst = delta(before, after)
    assert burst.mean_ms == {"POST pods": 20.0, "mutate.gpushare.io": 5.0}
    assert burst.calls == {"POST pods": 50, "mutate.gpushare.io": 100}
    assert (burst.handshakes, burst.reviews) == (3, 100)


def test_admission_plugins_are_shared_out_over_the_pods_created() -> None:
    """Every CREATE the plugins see (the pods and the controller's Events) is summed, then divided by the pods."""
    plugin = "apiserver_admission_controller_admission_duration_seconds"
    match = "apiserver_admission_match_condition_evaluation_seconds"
    text = APISERVER + f"""\
# TYPE {plugin} histogram
{plugin}_sum{{name="MutatingAdmissionWebhook",operation="CREATE",rejected="false",type="admit"}} 0.8
{plugin}_count{{name="MutatingAdmissionWebhook",operation="CREATE",rejected="false",type="admit"}} 200
{plugin}_sum{{name="ValidatingAdmissionPolicy",operation="CREATE",rejected="false",type="validate"}} 0.001
{plugin}_count{{name="ValidatingAdmissionPolicy",operation="CREATE",rejected="false",type="validate"}} 200
{plugin}_sum{{name="MutatingAdmissionWebhook",operation="UPDATE",rejected="false",type="admit"}} 9.0
{plugin}_count{{name="MutatingAdmissionWebhook",operation="UPDATE",rejected="false",type="admit"}} 9
# TYPE {match} histogram
{match}_sum{{name="mutate.gpushare.io",kind="webhook",operation="CREATE",type="admit"}} 0.02
{match}_count{{name="mutate.gpushare.io",kind="webhook",operation="CREATE",type="admit"}} 100
{match}_sum{{name="other.example.com",kind="webhook",operation="CREATE",type="admit"}} 5.0
{match}_count{{name="other.example.com",kind="webhook",operation="CREATE",type="admit"}} 100
"""
    burst = delta(Reading({}, 0, 0), Reading(sums(text, apiserver_series), 0, 0))
    # 100 pods: 0.8 s of mutating webhooks over 200 CREATEs is 8 ms a pod; 1 ms of policies (under 0.05 ms a pod)
    # and other entries' matchConditions are left out, as are UPDATEs.
    assert burst.per_pod_ms() == {"MutatingAdmissionWebhook": 8.0, "matchConditions mutate.gpushare.io": 0.2}
