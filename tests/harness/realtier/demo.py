"""`./dev demo --real`: the bug report's scenario and the shapes where the reference plugin fails, on the real-cluster
tier's node, the real reference stack beside ours.

Builds (once, cached) and starts the tier like `./dev e2e`, under the tier's lock (/tmp/gpushare-e2e.lock, so it
never runs beside another tier), then per run and stack: the bug report's scenario, pods with two GPU containers and
pods bound while the kubelet is down, with the reference stack (the reference extender and the reference device
plugin, both built from their sources, no admission control), with ours in env delivery, and with ours in cdi
delivery (behind the same reference extender); one side-by-side table per scenario and run. Tears everything down
at the end, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import IO

from deviceplugin.events import NORMAL_REFUSALS
from e2e import audit, toolchain
from e2e.cluster import Cluster
from e2e.control import EXTENDER_USER
from e2e.kube import Kubectl
from e2e.procs import StartError
from e2e.refstack import Stacks
from e2e.settings import from_environ
from tests.harness.judge import Outcome
from tests.harness.realtier import scenarios
from tests.harness.scenarios import BUG_REPORT, KUBELET_DOWN, TWO_CONTAINERS, Scenario

LOCK = Path("/tmp/gpushare-e2e.lock")
STACKS = ("reference", "env", "cdi")
HEADS = {"reference": "reference stack", "env": "gpushare, env", "cdi": "gpushare, cdi"}
SHOWN = (BUG_REPORT, TWO_CONTAINERS, KUBELET_DOWN)
ROWS: tuple[tuple[str, Callable[[Outcome], object]], ...] = (
    ("pods alive at the end", lambda o: o.pods),
    ("pods started", lambda o: o.started),
    ("started on the recorded GPU", lambda o: o.on_recorded_gpu),
    ("containers on made-up devices", lambda o: len(o.made_up)),
    ("containers on another pod's GPU", lambda o: len(o.wrong_gpu)),
    ("over-committed GPUs", lambda o: len(o.over_committed)),
    ("stuck pods", lambda o: len(o.stuck)),
    ("rejected by the kubelet (replaced)", lambda o: len(o.rejected)),
    ("refusals by our plugin (Warning Events)",
     lambda o: sum(n for r, n in o.plugin_refusals.items() if r not in NORMAL_REFUSALS)),
    ("deleted pods' containers not started", lambda o: o.plugin_refusals.get("GpuSharePodDeleting", 0)),
    ("first create to last start (s)", lambda o: "-" if o.seconds is None else f"{o.seconds:.0f}"),
)


@contextlib.contextmanager
def tier_lock() -> Iterator[None]:
    """Hold the tier's lock; when a `flock /tmp/gpushare-e2e.lock …` around this command holds it already (its
    descriptor is inherited), run under that one instead of waiting for ourselves."""
    with contextlib.suppress(OSError):
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/self/fd/{fd}") == str(LOCK):
                    yield
                    return
    handle: IO[str] = open(LOCK, "a")  # noqa: SIM115 - held for the whole run, closed below
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"Another real-cluster run holds {LOCK}; waiting for it to finish ...", flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        handle.close()


@contextlib.contextmanager
def scratch_namespace(cluster: Cluster, kubectl: Kubectl) -> Iterator[str]:
    name = "demo-" + uuid.uuid4().hex[:8]
    kubectl.ok(["create", "namespace", name])
    cluster.procs.wait_ready("kube-controller-manager", lambda: cluster.has("serviceaccount", "default", name), 60,
                             f"the default ServiceAccount of namespace {name}")
    try:
        yield name
    finally:
        kubectl.run(["delete", "namespace", name, "--wait=false"])
        kubectl.run(["delete", "pods", "--all", "-n", name, "--grace-period=0", "--force"], timeout=60)
        # The next stack starts on an empty node: wait (bounded) until this run's pods are gone.
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and kubectl.run(["get", "pods", "-n", name, "-o", "name"])[1].strip():
            time.sleep(1)


def table(outcomes: dict[str, Outcome]) -> str:
    stacks = [s for s in STACKS if s in outcomes]
    lines = [f"{'':<40}" + "".join(f"{HEADS[s]:>18}" for s in stacks)]
    for label, value in ROWS:
        lines.append(f"{label:<40}" + "".join(f"{value(outcomes[s])!s:>18}" for s in stacks))
    for s in stacks:
        o = outcomes[s]
        for what, items in (("stuck", o.stuck), ("made-up device", o.made_up), ("on another pod's GPU", o.wrong_gpu)):
            for item in items[:3]:
                lines.append(f"  {HEADS[s]}: {what}: {item}")
            if len(items) > 3:
                lines.append(f"  {HEADS[s]}: {what}: … and {len(items) - 3} more")
        if o.over_committed:
            lines.append(f"  {HEADS[s]}: units received per over-committed GPU: {o.over_committed}")
        for reason, count in sorted(o.plugin_refusals.items()):
            lines.append(f"  {HEADS[s]}: {count} Event(s) {reason}")
    return "\n".join(lines)


def timing(outcomes: dict[str, Outcome]) -> list[str]:
    """Our time against the reference stack's in the same run (the performance target: within 10%)."""
    ref = outcomes.get("reference")
    if ref is None or ref.seconds is None or ref.seconds <= 0:
        return ["  no reference time to compare with in this run"]
    out = []
    for mode in ("env", "cdi"):
        ours = outcomes.get(mode)
        if ours is None or ours.seconds is None:
            continue
        change = (ours.seconds - ref.seconds) / ref.seconds * 100
        verdict = "within 10%" if change <= 10 else "NOT within 10%"
        out.append(f"  gpushare {mode}: {ours.seconds:.0f} s against {ref.seconds:.0f} s ({change:+.0f}%): {verdict}")
    return out


def mean_outcomes(runs: Sequence[dict[str, Outcome]]) -> dict[str, Outcome]:
    """One Outcome per stack carrying the mean time over the runs that measured one (for `timing`)."""
    out = {}
    for stack in STACKS:
        times = [r[stack].seconds for r in runs if stack in r and r[stack].seconds is not None]
        if times:
            out[stack] = Outcome(stack, "", "", seconds=sum(t for t in times if t is not None) / len(times))
    return out


def run_once(cluster: Cluster, stacks: Stacks, order: Sequence[str],
             shown: Sequence[Scenario]) -> dict[str, dict[str, Outcome]]:
    """Every scenario with every stack: scenario name -> stack -> outcome."""
    kubectl = cluster.kubectl()
    outcomes: dict[str, dict[str, Outcome]] = {s.name: {} for s in shown}
    for stack in order:
        if stack == "reference":
            stacks.use_reference()
        else:
            stacks.use_ours(stack)
        for scenario in shown:
            print(f"  {HEADS[stack]}: {scenario.name} ...", flush=True)
            with scratch_namespace(cluster, kubectl) as namespace:
                outcomes[scenario.name][stack] = scenarios.run(cluster, kubectl, namespace, stack, scenario)
    return outcomes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev demo --real", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="how many times to run every stack (default 3)")
    parser.add_argument("--stacks", default=",".join(STACKS),
                        help="which stacks, in order, comma-separated (default reference,env,cdi)")
    args = parser.parse_args(argv)
    order = [s.strip() for s in args.stacks.split(",") if s.strip()]
    unknown = [s for s in order if s not in STACKS]
    if unknown or not order or args.runs < 1:
        parser.error(f"--stacks takes some of {', '.join(STACKS)} and --runs at least 1 (got {args.stacks!r}, "
                     f"{args.runs})")
    missing = toolchain.check()
    if missing:
        print("The real-cluster demo cannot run on this machine: " + "; ".join(missing))
        return 0

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    settings = from_environ()
    built = toolchain.ensure(settings)
    if built.reference is None:
        print("The real-cluster demo needs the reference stack: " + (toolchain.reference_missing(settings) or ""))
        return 1
    with tier_lock():
        cluster = Cluster(settings, built)
        try:
            print("Starting the real-cluster tier (upstream kube-apiserver, kube-scheduler with the reference "
                  "extender, kubelet, containerd) ...", flush=True)
            cluster.up()
            stacks = Stacks(cluster)
            every: list[dict[str, dict[str, Outcome]]] = []
            print("The bug report's scenario: a ReplicaSet of 30 pods x 8 GiB on one node with 4 GPUs of 64 GiB, a "
                  "10-second image pull,\n10 pods deleted while their image is pulled and replaced by the "
                  "ReplicaSet controller. Then 4 pods with two GPU containers of 4 GiB each,\nand 16 pods of 8 GiB "
                  "bound while the kubelet is stopped, admitted as one batch when it starts.\n")
            for n in range(1, args.runs + 1):
                print(f"Run {n} of {args.runs}:", flush=True)
                outcomes = run_once(cluster, stacks, order, SHOWN)
                every.append(outcomes)
                for scenario in SHOWN:
                    print(f"\n{scenario.name} (run {n}):\n" + table(outcomes[scenario.name]))
                print("\nThe bug report's scenario, first create to last container start, ours against the reference "
                      "stack:")
                print("\n".join(timing(outcomes[BUG_REPORT.name])) + "\n", flush=True)
            if args.runs > 1:
                print(f"Over all {args.runs} runs (mean seconds; one run's figures move by several seconds on a "
                      "shared machine):")
                print("\n".join(timing(mean_outcomes([r[BUG_REPORT.name] for r in every]))) + "\n")
            # Only our runs: in the reference runs no gpushare admission is installed.
            ours = {o.namespace for r in every for by_stack in r.values() for s, o in by_stack.items()
                    if s != "reference"}
            writes = [w for w in audit.read(cluster.audit_log, EXTENDER_USER)
                      if w.judged_by_webhook and w.pod.split("/")[0] in ours]
            refused = [w for w in writes if w.verdict != "allowed"]
            print(f"The extender's annotation writes judged by the gpushare validating webhook: {len(writes)}, "
                  f"refused: {len(refused)}.")
            for write in refused:
                print("  " + write.row())
            print("In this tier no NVIDIA runtime hook runs: a container told no-gpu-has-… starts anyway (counted "
                  "above as started, on a made-up device); on a GPU node the hook refuses it.")
        except (StartError, toolchain.ToolchainError, AssertionError) as exc:
            print(f"The real-cluster demo stopped: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("Interrupted; tearing the tier down.", file=sys.stderr)
            return 130
        finally:
            cluster.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
