"""`./dev demo`: the bug report's scenario against gpushare and the reference algorithm, side by side."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.harness.sim.scenario import Result

ROWS = (
    ("pods alive at the end", lambda r: r.summary.pods),
    ("started", lambda r: r.summary.started),
    ("started on the right GPU", lambda r: r.summary.right_gpu),
    ("made-up device ids handed out", lambda r: r.summary.made_up_ids),
    ("failed with a clear message", lambda r: r.summary.failed_clearly),
    ("stuck with no usable cause", lambda r: r.summary.other),
    ("invariant violations", lambda r: len(r.violations)),
)


def table(ours: Result, baseline: Result) -> str:
    head = ("", "gpushare (webhook + plugin)", "reference algorithm")
    lines = [f"{head[0]:<32}{head[1]:>30}{head[2]:>22}"]
    for label, value in ROWS:
        lines.append(f"{label:<32}{value(ours):>30}{value(baseline):>22}")
    return "\n".join(lines)


# What each invariant kind means (tests/harness/judge.py), printed beside its count.
MEANINGS = {
    "wrong-gpu": "containers that run on a GPU other than the one their own pod records: the plugin handed them "
                 "another pod's GPU",
    "overcommit": "GPUs where the running containers, or the pods recorded there, ask for more memory than the GPU "
                  "has: containers landed on GPUs the scheduler did not count them on",
    "made-up-device": "containers handed a NVIDIA_VISIBLE_DEVICES that names no GPU, which the runtime refuses "
                      "with 'unknown device id'",
    "unrequested-gpu": "containers that asked for no GPU memory but see a GPU",
    "no-message": "pods stuck without a message naming the cause",
    "not-released": "deleted pods that still hold devices",
    "not-settled": "scenarios whose pods were still changing at the end",
}


def examples(result: Result, limit: int = 5) -> list[str]:
    kinds = Counter(v.kind for v in result.violations)
    out = [f"  {kind}: {count} ({MEANINGS.get(kind, 'see tests/harness/judge.py')})"
           for kind, count in sorted(kinds.items())]
    out += [f"  e.g. {v.message}" for v in result.violations[:limit]]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev demo", description=__doc__)
    parser.add_argument("--delivery", choices=("env", "cdi"), default="env", help="delivery mode for gpushare")
    parser.add_argument("--seed", type=int, default=101, help="seed for binding delays and deletions")
    parser.add_argument("--verbose", action="store_true", help="show the actors' log lines")
    args = parser.parse_args(argv)
    # gRPC's C core logs connection teardown at INFO on stderr; the table is what this command is for.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    from tests.harness.scenarios import reference_scenario
    from tests.harness.sim.cluster import SimCluster
    from tests.harness.sim.scenario import reference_cluster, run_scenario
    from tests.harness.webhook.server import webhook_server

    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR, format="%(name)s: %(message)s")
    scenario = reference_scenario(args.seed)
    print("The reference failure (AliyunContainerService/gpushare-device-plugin#26), simulated:")
    print("a Deployment of 30 pods x 8 GiB on one node with 4 GPUs of 64 GiB, a 2-second image pull,")
    print("10 pods deleted while their images pull and replaced by the ReplicaSet.\n")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gs-demo-") as directory:
        print(f"Running with the gpushare webhook and device plugin ({args.delivery} delivery) ...", flush=True)
        with webhook_server(Path(directory), {"GPUSHARE_DELIVERY": args.delivery}) as hook, SimCluster(
            reference_cluster("ours", args.delivery, args.seed), hook
        ) as cluster:
            ours = run_scenario(cluster, scenario)
    print("Running with the reference plugin's algorithm (no webhook, as the reference deployment has) ...",
          flush=True)
    with SimCluster(reference_cluster("baseline", "env", args.seed)) as cluster:
        baseline = run_scenario(cluster, scenario)
    print()
    print(table(ours, baseline))
    for name, result in (("gpushare", ours), ("reference algorithm", baseline)):
        if result.violations:
            print(f"\nInvariant violations with the {name}:")
            print("\n".join(examples(result)))
    if not baseline.violations:
        print("\nThis time the reference algorithm got lucky: its failure depends on the order in which the")
        print("kubelet admits pods. Run again, or with another --seed, to see it.")
    print(f"\nDone in {time.monotonic() - started:.0f} s.")
    return 0 if not ours.violations else 1


if __name__ == "__main__":
    sys.exit(main())
