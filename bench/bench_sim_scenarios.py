"""How fast the simulated cluster runs: tiny seeded scenarios per second (gpushare), and the bug report's
scenario end to end for gpushare and for the reference algorithm measured in the same run.

    .venv/bin/python -m bench.bench_sim_scenarios [--scenarios 40] [--delivery env]
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from tests.harness.scenarios import random_scenario, reference_scenario
from tests.harness.sim.cluster import ClusterSpec, SimCluster
from tests.harness.sim.scenario import reference_cluster, run_scenario
from tests.harness.webhook.server import webhook_server


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scenarios", type=int, default=40)
    parser.add_argument("--delivery", choices=("env", "cdi"), default="env")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="gs-bench-") as directory, webhook_server(
        Path(directory), {"GPUSHARE_DELIVERY": args.delivery}
    ) as hook:
        started = time.monotonic()
        with SimCluster(ClusterSpec(delivery=args.delivery), hook) as cluster:
            up = time.monotonic() - started
            started = time.monotonic()
            bad = sum(1 for seed in range(args.scenarios) if run_scenario(cluster, random_scenario(seed)).violations)
            tiny = time.monotonic() - started
        print(f"cluster start-up: {up:.2f} s")
        print(f"{args.scenarios} tiny scenarios ({args.delivery}): {tiny:.1f} s, {tiny / args.scenarios:.2f} s each, "
              f"{bad} with violations")
        timings = {}
        for plugin in ("ours", "baseline"):
            with SimCluster(reference_cluster(plugin, args.delivery), hook if plugin == "ours" else None) as cluster:
                result = run_scenario(cluster, reference_scenario())
            timings[plugin] = result.elapsed_s
            print(f"reference scenario, {plugin}: {result.elapsed_s:.1f} s, {result.summary}")
    print(f"ratio gpushare / reference algorithm (reference scenario wall time): "
          f"{timings['ours'] / timings['baseline']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
