"""Latency of the plugin's Allocate and PreStartContainer over real unix sockets, with many pods on the node.

Run: .venv/bin/python -m bench.bench_deviceplugin_calls [--pods 300] [--gpus 8x80GiB] [--delivery env|cdi]
The API server is the in-memory fake of the tests, so the figures are the plugin's own cost (validation,
signature check, PodResources round trip, CDI write), not the network's. The baseline, measured in the same
run over the same socket, is GetDevicePluginOptions: a gRPC round trip that decides nothing.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from deviceplugin.api import deviceplugin_pb2 as pb
from tests.deviceplugin.fakes import spec_pod, stamped
from tests.deviceplugin.rig import make_rig
from webhook.protocol import Assignment


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(name: str, seconds: list[float], baseline: float) -> None:
    ms = [s * 1000 for s in seconds]
    ratio = statistics.mean(seconds) / baseline
    print(f"{name:<18} n={len(ms):<5} mean={statistics.mean(ms):7.2f} ms  p50={percentile(ms, 0.5):7.2f} ms  "
          f"p95={percentile(ms, 0.95):7.2f} ms  max={max(ms):7.2f} ms  x baseline={ratio:6.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--pods", type=int, default=300)
    parser.add_argument("--gpus", default="8x80GiB")
    parser.add_argument("--delivery", default="env", choices=["env", "cdi"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpb-", dir="/tmp") as tmp:
        rigs = make_rig(Path(tmp), gpus=args.gpus, GPUSHARE_DELIVERY=args.delivery, GPUSHARE_MAX_DEVICES="100000")
        rig = next(rigs)
        try:
            rig.kubelet.wait_registrations(1)
            rng = random.Random(1)
            gpus = rig.inventory.gpus
            used = [0] * len(gpus)
            names = []
            for n in range(args.pods):
                units = rng.randint(1, 4)
                index = next((i for i, u in enumerate(used) if u + units <= gpus[i].memory_units), None)
                if index is None:
                    break
                used[index] += units
                pod = stamped(spec_pod(f"job-{n}", {"main": units}), rig.contract, rig.signer)
                pod["metadata"]["annotations"].update(
                    Assignment(index, gpus[index].memory_units, units, n, False).annotations()
                )
                rig.api.add(pod)
                names.append((f"job-{n}", units))
            stub = rig.kubelet.plugin()
            options = []
            for _ in range(200):
                begin = time.perf_counter()
                stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
                options.append(time.perf_counter() - begin)
            baseline = statistics.mean(options)
            allocate, prestart = [], []
            for name, units in names:
                begin = time.perf_counter()
                rig.kubelet.admit("team", name, [("main", units)])
                allocate.append(time.perf_counter() - begin)
            rng.shuffle(names)
            for name, _ in names:
                begin = time.perf_counter()
                rig.kubelet.start_container("team", name, "main")
                prestart.append(time.perf_counter() - begin)
            restart = []
            for name, _ in names[:50]:
                begin = time.perf_counter()
                rig.kubelet.start_container("team", name, "main")
                restart.append(time.perf_counter() - begin)
            print(f"{len(names)} pods on {args.gpus}, delivery {args.delivery}")
            report("Options (baseline)", options, baseline)
            report("Allocate", allocate, baseline)
            report("PreStartContainer", prestart, baseline)
            report("PreStart (restart)", restart, baseline)
        finally:
            rigs.close()


if __name__ == "__main__":
    main()
