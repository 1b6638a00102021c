"""`gpushare-certs install | rotate | signing-key`: the webhook's certificates and signing keys, in a cluster.

Every step reads the current state first and writes only what is missing or due, so a command that stopped
half-way (a lost connection, a refused permission) is finished by running it again.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from certs.build import DEFAULT_NAMESPACE, DEFAULT_SERVICE, Issued, build_ca, build_serving_cert, build_signing_key
from certs.cluster import Cluster, ClusterError
from certs.plan import (
    CA_SECRET,
    CONFIGURATION_KINDS,
    SIGNING_SECRET,
    TLS_SECRET,
    VERIFY_CONFIGMAP,
    WEBHOOK_CONFIGURATION,
    CaState,
    PlanError,
    bundle_needs_update,
    ca_data,
    managed_by_cert_manager,
    parse_ca_state,
    pem,
    serving_from,
    serving_problem,
    signing_data,
    signing_key_from,
    tls_data,
    verify_data,
)

Say = Callable[[str], None]
# (what is awaited, seconds): the CLI sleeps; tests wait for the condition itself.
Settle = Callable[[str, float], None]

# An API server reloads webhook configurations from its informer within a second or two; several API servers
# each do so on their own, so give them a little longer before any replica serves the new CA's certificate.
API_SERVER_SETTLE_SECONDS = 15.0
# The kubelet refreshes Secret volumes on its sync period (1 minute by default, plus its cache TTL), and the
# webhook reloads changed files on the next connection: three minutes covers both with a margin.
DEFAULT_OVERLAP_SECONDS = 180.0


@dataclass(frozen=True)
class Target:
    namespace: str = DEFAULT_NAMESPACE
    service: str = DEFAULT_SERVICE
    # DNS names or IPs the serving certificate names beside the Service's, for a webhook reached by URL.
    extra_hosts: tuple[str, ...] = ()


@dataclass(frozen=True)
class Run:
    """One command's cluster, target, clock and output."""

    cluster: Cluster
    target: Target
    now: datetime.datetime
    say: Say


def _refuse_cert_manager(cluster: Cluster) -> None:
    configs = [c for kind in CONFIGURATION_KINDS if (c := cluster.read_configuration(kind, WEBHOOK_CONFIGURATION))]
    problem = managed_by_cert_manager(configs)
    if problem:
        raise PlanError(problem)


def publish_trust(run: Run, trusted: list[Issued]) -> list[str]:
    """Set caBundle on both webhook configurations; returns the kinds that do not exist (yet)."""
    cluster, say = run.cluster, run.say
    certs = [i.cert for i in trusted]
    missing = []
    for kind in CONFIGURATION_KINDS:
        config = cluster.read_configuration(kind, WEBHOOK_CONFIGURATION)
        if config is None:
            missing.append(kind)
        elif bundle_needs_update(config, certs):
            cluster.set_ca_bundle(config, pem(certs))
            say(f"Set the caBundle of {kind} {WEBHOOK_CONFIGURATION} to {len(certs)} CA certificate(s).")
    return missing


def ensure_serving(run: Run, signer: Issued, trusted: list[Issued], *, force: bool = False) -> None:
    """The TLS Secret holds a serving certificate from `signer` for the Service, and `trusted` as ca.crt."""
    cluster, target, now, say = run.cluster, run.target, run.now, run.say
    ns = target.namespace
    stored = cluster.read_secret(ns, TLS_SECRET)
    serving = serving_from(stored, ns)
    problem = "a new one was asked for" if force else serving_problem(
        serving, signer.cert, now, service=target.service, namespace=ns, extra_hosts=target.extra_hosts
    )
    if problem is None and serving is not None and stored is not None:
        if stored.data.get("ca.crt") == pem(i.cert for i in trusted):
            return
    else:
        serving = build_serving_cert(
            signer, now, service=target.service, namespace=ns, extra_hosts=target.extra_hosts
        )
        say(f"Issued a serving certificate for {target.service}.{ns}.svc, valid until "
            f"{serving.cert.not_valid_after_utc:%Y-%m-%d} ({problem}).")
    cluster.write_secret(ns, TLS_SECRET, tls_data(serving, [i.cert for i in trusted]), "kubernetes.io/tls", stored)
    say(f"Wrote Secret {ns}/{TLS_SECRET}.")


def ensure_signing_pair(run: Run, *, allow_update: bool) -> None:
    """Secret gpushare-signing-key (private) and ConfigMap gpushare-verify-key (public), one key pair."""
    cluster, namespace, say = run.cluster, run.target.namespace, run.say
    stored = cluster.read_secret(namespace, SIGNING_SECRET)
    key = signing_key_from(stored, namespace)
    published = cluster.read_configmap(namespace, VERIFY_CONFIGMAP)
    if key is None:
        if published is not None and not allow_update:
            raise PlanError(
                f"ConfigMap {namespace}/{VERIFY_CONFIGMAP} exists but Secret {namespace}/{SIGNING_SECRET} does not, "
                f"so its private key is lost; delete the ConfigMap and run this again to make a new key pair."
            )
        key = build_signing_key()
        cluster.write_secret(namespace, SIGNING_SECRET, signing_data(key), "Opaque", None)
        say(f"Created the intent-signing key in Secret {namespace}/{SIGNING_SECRET}.")
    want = verify_data(key)
    if published is None:
        cluster.write_configmap(namespace, VERIFY_CONFIGMAP, want, None)
        say(f"Published its public key in ConfigMap {namespace}/{VERIFY_CONFIGMAP}.")
    elif published.data.get("signing.pub") != want["signing.pub"]:
        if not allow_update:
            raise PlanError(
                f"ConfigMap {namespace}/{VERIFY_CONFIGMAP} holds a different public key than Secret "
                f"{namespace}/{SIGNING_SECRET}; delete the ConfigMap and run this again to publish the right one."
            )
        cluster.write_configmap(namespace, VERIFY_CONFIGMAP, want, published)
        say(f"Updated ConfigMap {namespace}/{VERIFY_CONFIGMAP} to the public key of Secret "
            f"{namespace}/{SIGNING_SECRET}.")


def install(run: Run) -> list[str]:
    """CA, serving certificate, signing key pair and caBundle; returns the configuration kinds still missing."""
    cluster, ns, now, say = run.cluster, run.target.namespace, run.now, run.say
    _refuse_cert_manager(cluster)
    if cluster.ensure_namespace(ns):
        say(f"Created namespace {ns}.")
    stored = cluster.read_secret(ns, CA_SECRET)
    state = parse_ca_state(stored, ns)
    if state is None:
        state = CaState(build_ca(now))
        cluster.write_secret(ns, CA_SECRET, ca_data(state), "Opaque", None)
        say(f"Created a CA in Secret {ns}/{CA_SECRET}, valid until {state.current.cert.not_valid_after_utc:%Y-%m-%d}.")
    elif state.next is not None:
        raise PlanError(
            f"A CA rotation is in progress (Secret {ns}/{CA_SECRET} holds next-ca.crt); finish it with "
            f"`gpushare-certs rotate --new-ca --namespace {ns}` and then run install again."
        )
    trusted = [state.current]
    ensure_serving(run, state.current, trusted)
    ensure_signing_pair(run, allow_update=True)
    return publish_trust(run, trusted)


def rotate(run: Run, settle: Settle, *, new_ca: bool = False, overlap_seconds: float = DEFAULT_OVERLAP_SECONDS) -> None:
    """A new serving certificate from the same CA; or, with new_ca, a new CA trusted before it is used."""
    cluster, ns, now, say = run.cluster, run.target.namespace, run.now, run.say
    _refuse_cert_manager(cluster)
    stored = cluster.read_secret(ns, CA_SECRET)
    state = parse_ca_state(stored, ns)
    if state is None:
        raise PlanError(f"There is no CA in Secret {ns}/{CA_SECRET}; run `gpushare-certs install --namespace {ns}` "
                        "first.")
    if not new_ca:
        if state.next is not None:
            raise PlanError(f"A CA rotation is in progress (Secret {ns}/{CA_SECRET} holds next-ca.crt); finish it "
                            f"with `gpushare-certs rotate --new-ca --namespace {ns}`.")
        # The caBundle already trusts this CA, so old and new serving certificates both verify meanwhile.
        publish_trust(run, [state.current])
        ensure_serving(run, state.current, [state.current], force=True)
        say("The webhook serves the new certificate once the kubelet updates the Secret volume (about a minute); "
            "no restart is needed.")
        return
    if state.next is None:
        state = CaState(state.current, build_ca(now))
        cluster.write_secret(ns, CA_SECRET, ca_data(state), "Opaque", stored)
        say(f"Created the next CA in Secret {ns}/{CA_SECRET}; the current one stays trusted until the switch is done.")
    else:
        say(f"Resuming the CA rotation recorded in Secret {ns}/{CA_SECRET}.")
    assert state.next is not None
    both = [state.current, state.next]
    # 1. Trust both CAs: every replica still serves a certificate from the old one.
    publish_trust(run, both)
    ensure_serving(run, state.current, both)
    settle("the API servers to load the caBundle that trusts both CAs", min(API_SERVER_SETTLE_SECONDS, overlap_seconds))
    # 2. Serve a certificate from the new CA; replicas switch one by one as the kubelet updates their volumes.
    ensure_serving(run, state.next, both)
    settle("every webhook replica to load the certificate from the new CA", overlap_seconds)
    # 3. Drop the old CA: trust first, then the record, so an interruption resumes at step 1 harmlessly.
    publish_trust(run, [state.next])
    cluster.write_secret(ns, CA_SECRET, ca_data(CaState(state.next)), "Opaque", cluster.read_secret(ns, CA_SECRET))
    ensure_serving(run, state.next, [state.next])
    say(f"The CA rotation is complete: Secret {ns}/{CA_SECRET} and both caBundles hold only the new CA.")


def signing_key(run: Run) -> None:
    ensure_signing_pair(run, allow_update=False)


# ---------------------------------------------------------------------------------------------------------
# Command line.

ClusterFactory = Callable[[argparse.Namespace], Cluster]


def kube_cluster(args: argparse.Namespace) -> Cluster:
    from certs.cluster import KubeCluster

    return KubeCluster(args.kubeconfig, args.context, args.in_cluster)


def sleeping_settle(what: str, seconds: float) -> None:
    if seconds > 0:
        print(f"Waiting {seconds:g} s for {what} ...", flush=True)
        time.sleep(seconds)


def say(line: str) -> None:
    print(line, flush=True)


def _run(args: argparse.Namespace, action: Callable[[Run], int]) -> int:
    factory: ClusterFactory = getattr(args, "cluster_factory", kube_cluster)
    try:
        hosts = tuple(getattr(args, "extra_host", None) or ())
        target = Target(args.namespace, getattr(args, "service", DEFAULT_SERVICE), hosts)
        cluster = factory(args)
    except ClusterError as exc:
        print(str(exc), file=sys.stderr)
        return 2  # no credentials: a start-up failure, checked before anything is read or written
    try:
        return action(Run(cluster, target, datetime.datetime.now(datetime.UTC), say))
    except (ClusterError, PlanError) as exc:
        print(str(exc), file=sys.stderr)
        return 1


def _install(args: argparse.Namespace) -> int:
    def action(run: Run) -> int:
        missing = install(run)
        if missing:
            say(f"The {' and '.join(missing)} {WEBHOOK_CONFIGURATION} do not exist yet, so no caBundle was set; "
                "run `kubectl apply -k manifests/self-signed` and then this command again (it keeps the keys).")
            return 0
        say(f"Installed: the webhook in {args.namespace} can serve, and the API server trusts it.")
        return 0

    return _run(args, action)


def _rotate(args: argparse.Namespace) -> int:
    settle: Settle = getattr(args, "settle", sleeping_settle)

    def action(run: Run) -> int:
        rotate(run, settle, new_ca=args.new_ca, overlap_seconds=args.overlap_seconds)
        return 0

    return _run(args, action)


def _signing_key(args: argparse.Namespace) -> int:
    def action(run: Run) -> int:
        signing_key(run)
        say(f"The intent-signing key pair is in place in {args.namespace}.")
        return 0

    return _run(args, action)


def _common(parser: argparse.ArgumentParser, service: bool = True) -> None:
    parser.add_argument("--namespace", default=DEFAULT_NAMESPACE, help="the webhook's namespace (default %(default)s)")
    if service:
        parser.add_argument("--service", default=DEFAULT_SERVICE, help="the webhook Service (default %(default)s)")
        parser.add_argument(
            "--extra-host", action="append", metavar="NAME_OR_IP",
            help="another DNS name or IP the serving certificate names (repeatable), for a webhook the API server "
            "reaches by URL rather than through its Service",
        )
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    parser.add_argument("--context", default=None, help="kubeconfig context (default: the current one)")
    parser.add_argument("--in-cluster", action="store_true", help="use the pod's service account (in a Job)")


def register(subparsers: Any) -> None:
    """Add install, rotate and signing-key to gpushare-certs (argparse's subparsers action is private)."""
    install_parser = subparsers.add_parser(
        "install", help="create the CA, serving certificate and signing keys in the cluster and set caBundle"
    )
    _common(install_parser)
    install_parser.set_defaults(command=_install)
    rotate_parser = subparsers.add_parser(
        "rotate", help="new serving certificate from the same CA, or --new-ca with an overlap period"
    )
    _common(rotate_parser)
    rotate_parser.add_argument("--new-ca", action="store_true", help="replace the CA too, trusting both meanwhile")
    rotate_parser.add_argument(
        "--overlap-seconds", type=float, default=DEFAULT_OVERLAP_SECONDS,
        help="with --new-ca: how long both CAs stay trusted after the switch (default %(default)g)",
    )
    rotate_parser.set_defaults(command=_rotate)
    signing_parser = subparsers.add_parser(
        "signing-key", help="create the intent-signing key pair (Secret + ConfigMap) unless it exists"
    )
    _common(signing_parser, service=False)
    signing_parser.set_defaults(command=_signing_key)
