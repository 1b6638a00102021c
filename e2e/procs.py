"""Processes of the tier: started in their own session, recorded by PID in a state file, stopped by PID.

The state file lets `python -m e2e.cluster down` (run by `./dev e2e` on exit, also after Ctrl-C or a crash)
stop what an earlier run left behind, and lets a new run refuse to start over a live one.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# Every process the tier starts carries this variable (its value: the run directory), so that `down` also finds
# one the state file lost track of: a crashed harness, or one started by hand.
OWNER = "GPUSHARE_E2E_OWNER"


class StartError(Exception):
    """A process did not start or did not become ready; the text names it and ends with its log."""


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class Proc:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is not alive: read its state.
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    return True


def stop_pid(pid: int, grace: float = 10.0, *, group: bool = True) -> None:
    """SIGTERM (to the process group we created), then SIGKILL after `grace` seconds."""
    def send(sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
    send(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        send(signal.SIGKILL)
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)


class Processes:
    """Every process of one cluster, in start order; the state file mirrors it."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.logs = run_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.state = run_dir / "pids.json"
        self.procs: dict[str, Proc] = {}

    def _save(self) -> None:
        data = {name: proc.pid for name, proc in self.procs.items() if proc.alive()}
        tmp = self.state.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.rename(self.state)

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
              cwd: Path | None = None) -> Proc:
        if name in self.procs and self.procs[name].alive():
            raise StartError(f"{name} is already running (PID {self.procs[name].pid})")
        log = self.logs / f"{name}.log"
        with open(log, "ab") as out:
            out.write(f"\n==== {time.strftime('%H:%M:%S')} starting {' '.join(argv)}\n".encode())
            out.flush()
            process = subprocess.Popen(
                list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**(env if env is not None else os.environ), OWNER: str(self.run_dir)}, cwd=cwd,
                start_new_session=True,
            )
        self.procs[name] = Proc(name, process, log)
        self._save()
        return self.procs[name]

    def stop(self, name: str, grace: float = 10.0) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None:
            stop_pid(proc.pid, grace)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.process.wait(timeout=1)
            self._save()

    def exited(self) -> dict[str, str]:
        """The processes that ended without being stopped: each one's exit status and the end of its log."""
        return {name: f"exited with status {proc.process.returncode}; its log ends:\n{log_tail(proc.log, 15)}"
                for name, proc in self.procs.items() if not proc.alive()}

    def stop_all(self) -> None:
        for name in reversed(list(self.procs)):
            self.stop(name, grace=5.0 if name != "kubelet" else 10.0)

    def wait_ready(self, name: str, ready: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll `ready` until it holds; fail with the process's log when it exits or time runs out."""
        proc = self.procs[name]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not proc.alive():
                raise StartError(f"{name} exited with status {proc.process.returncode} before {what}; its log:\n"
                                 f"{log_tail(proc.log)}")
            try:
                if ready():
                    return
            except Exception:
                pass
            time.sleep(0.2)
        raise StartError(f"{name} did not reach '{what}' within {timeout:g} s; its log:\n{log_tail(proc.log)}")


def owned_pids(run_dir: Path) -> list[int]:
    """PIDs of live processes started by the tier for `run_dir` (found by their OWNER variable)."""
    marker = f"{OWNER}={run_dir}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
    return found


def stop_recorded(run_dir: Path) -> list[str]:
    """Stop every process an earlier run recorded (in reverse start order); returns their names."""
    state = run_dir / "pids.json"
    try:
        recorded: dict[str, int] = json.loads(state.read_text())
    except (OSError, ValueError):
        recorded = {}
    stopped = []
    for name, pid in reversed(list(recorded.items())):
        if _alive(pid):
            stop_pid(pid, grace=5.0)
            stopped.append(name)
    state.unlink(missing_ok=True)
    for pid in owned_pids(run_dir):
        if _alive(pid):
            stop_pid(pid, grace=5.0, group=False)
            stopped.append(f"PID {pid}")
    return stopped
