"""`kubectl gpushare` (the `kubectl-gpushare` executable): every GPU of the cluster and the pods promised to it."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from common import cli
from common.cli import Variable
from common.escape import printable
from common.settings import SettingsError
from contract import DEFAULT_PREFIX, DEFAULT_RESOURCE, Contract, ProtocolError, contract_from
from kubectlplugin import cluster, dra, model, render
from kubectlplugin.impersonation import Identity

PROG = "kubectl-gpushare"
# The distribution that ships the plugin alone (packaging/kubectl-gpushare), else the project's own.
DISTRIBUTIONS = ("kubectl-gpushare", cli.DISTRIBUTION)
USAGE = ("kubectl gpushare [NODE ...] [-d] [-o {table,wide,json,yaml}] [-l SELECTOR] [-n NAMESPACE | -A]\n"
         "                        [--kubeconfig PATH] [--context NAME] [--as USER [--as-group GROUP ...]]")
OUTPUTS = ("table", "wide", "json", "yaml")
VARIABLES = (
    Variable("GPUSHARE_RESOURCE_NAME", DEFAULT_RESOURCE, "the shared resource, as the webhook and the plugins have it"),
    Variable("GPUSHARE_UNIT", "GiB", "what one unit is: GiB or MiB"),
    Variable("GPUSHARE_ANNOTATION_PREFIX", DEFAULT_PREFIX, "prefix of the intent and allocation annotations"),
    Variable("KUBECONFIG", "~/.kube/config", "kubeconfig files separated by ':' (--kubeconfig takes precedence)"),
)
EPILOG = """\
It reads node capacity, pods (annotations and status) and Events only (the gpushare protocol, or the reference
scheduler extender's ALIYUN_COM_GPU_MEM_* keys), so it works beside either. A GPU's PROMISED memory is the sum of
the pods the scheduler extender placed on it (ALIYUN_COM_GPU_MEM_POD); ALLOCATED counts those whose containers got it
(ALIYUN_COM_GPU_MEM_ASSIGNED=true). Pod states: requested (no annotation yet), stamped (the webhook's signed
intent), assigned (a GPU chosen), allocated (the device plugin delivered it), deleting (being deleted: it
holds its units only while a GPU container of it may still run, as the scheduler extender frees them at the
deletion), refused (the kubelet recorded the plugin's refusal in the pod's status; the reason is the plugin's Event
where one may be the plugin's, else the kubelet's message), invalid (annotations that break the protocol). An Event
never sets a state: anyone who may create Events in a namespace can forge one. What comes from the cluster is
printed with its control characters escaped (a newline as \\n).

Exit status: 0 shown, 1 the cluster could not be read (one line says why), 2 bad arguments or settings."""


@dataclass(frozen=True)
class Options:
    access: cluster.Access
    contract: Contract
    namespace: str | None
    nodes: tuple[str, ...]
    details: bool
    output: str
    selector: str = ""


def _timeout(text: str) -> float:
    value = float(text.rstrip("s"))
    if not math.isfinite(value) or value <= 0:
        raise ValueError(text)
    return value


def parser() -> argparse.ArgumentParser:
    out = cli.parser(PROG, __doc__ or "", VARIABLES, EPILOG, distributions=DISTRIBUTIONS)
    out.usage = USAGE
    out.add_argument("nodes", nargs="*", metavar="NODE", help="show only these nodes (default: every GPU node)")
    out.add_argument("-d", "--details", action="store_true",
                     help="also list every GPU-share container: namespace, pod, units, state and reason")
    out.add_argument("-o", "--output", choices=OUTPUTS, default="table",
                     help="table (the default); wide: the table with the pods of each GPU; json or yaml: one "
                          "document of kind GpushareStatus with every figure and pod")
    out.add_argument("-l", "--selector", default="", help="count only the pods this label selector matches, such "
                     "as app=train or 'tier in (a,b)' (the API server applies it)")
    out.add_argument("--kubeconfig", default="", help="path to the kubeconfig file (default: KUBECONFIG, then "
                     "~/.kube/config)")
    out.add_argument("--context", default="", help="the kubeconfig context to use (default: its current-context)")
    out.add_argument("--as", dest="as_user", default="", metavar="USER",
                     help="act as this user or ServiceAccount (system:serviceaccount:NAMESPACE:NAME), as kubectl "
                          "--as does; needs the right to impersonate it")
    out.add_argument("--as-group", dest="as_groups", action="append", default=[], metavar="GROUP",
                     help="act as a member of this group too; repeat it for more groups (needs --as)")
    scope = out.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", default=None,
                       help="count only the pods of this namespace (default: every namespace, since a GPU is "
                            "shared across namespaces)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="count the pods of every namespace "
                       "(the default)")
    out.add_argument("--request-timeout", type=_timeout, default=10.0, metavar="SECONDS",
                     help="bound of each request to the API server (default 10)")
    out.add_argument("--resource", default=None, help="the shared resource (default GPUSHARE_RESOURCE_NAME)")
    out.add_argument("--unit", choices=("GiB", "MiB"), default=None, help="what one unit is (default GPUSHARE_UNIT)")
    out.add_argument("--annotation-prefix", default=None, help="prefix of the gpushare annotations (default "
                     "GPUSHARE_ANNOTATION_PREFIX)")
    return out


def options_from(argv: Sequence[str], env: Mapping[str, str]) -> Options:
    """The arguments and the environment, checked; argparse exits 2 with one line on a bad argument."""
    args = parser().parse_args(argv)
    try:
        shared = contract_from(env)
        contract = Contract(resource=args.resource or shared.resource, unit=args.unit or shared.unit,
                            prefix=args.annotation_prefix or shared.prefix)
    except (SettingsError, ProtocolError) as exc:
        parser().error(str(exc))
    if args.as_groups and not args.as_user:
        parser().error("--as-group needs --as: name the user to act as, such as --as jane --as-group admins")
    access = cluster.Access(kubeconfig=args.kubeconfig, env_kubeconfig=env.get("KUBECONFIG", ""),
                            home=env.get("HOME", ""), context=args.context, timeout=args.request_timeout,
                            identity=Identity(args.as_user, tuple(args.as_groups)))
    return Options(access, contract, args.namespace, tuple(args.nodes), args.details, args.output,
                   args.selector.strip())


def show(options: Options, snapshot: cluster.Snapshot) -> str:
    shares = dra.claim_rows(snapshot.claims, snapshot.pods, options.contract.unit)
    if options.selector:  # a claim's share counts when a pod the selector matched holds it
        listed = {(str(m.get("namespace", "")), str(m.get("name", ""))) for m in
                  (p.get("metadata") or {} for p in snapshot.pods)}
        shares = [row for row in shares if (row.namespace, row.name) in listed]
    report = replace(model.build(snapshot.nodes, snapshot.pods, snapshot.events, options.contract,
                                 namespace=options.namespace, only_nodes=options.nodes, shares=shares),
                     selector=options.selector)
    if options.output in ("json", "yaml"):
        return render.as_json(report) if options.output == "json" else render.as_yaml(report)
    text = render.summary(report, wide=options.output == "wide")
    return text + "\n\n" + render.details(report) if options.details else text


def main(argv: Sequence[str] | None = None) -> int:
    options = options_from(sys.argv[1:] if argv is None else argv, os.environ)
    try:
        snapshot = cluster.read(options.access, options.namespace, options.selector)
    except cluster.ClusterError as exc:
        text = str(exc)  # it may quote the API server's answer: printed through `printable`, as the tables are
        print(printable(f"error: {text[:1].upper()}{text[1:]}{'' if text.endswith('.') else '.'}"), file=sys.stderr)
        return 1
    print(show(options, snapshot))
    for note in snapshot.notes:  # on stderr: `-o json` and `-o yaml` stay one document
        print(printable(f"warning: {note[:1].upper()}{note[1:]}{'' if note.endswith('.') else '.'}"), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
