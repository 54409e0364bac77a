"""Several "machines" on one box for tests of multi-machine (Dask distributed) emulation.

`NamespaceCluster(prefix)` builds, with `ip -batch`:

* a "wire" namespace `{prefix}wire` holding a Linux bridge `br0` (the machines' shared underlay);
* a "head" namespace `{prefix}head` (underlay address `{subnet}.1`) running a Dask scheduler;
* machine namespaces `{prefix}m0`, `{prefix}m1`, ... (`{subnet}.2`, `{subnet}.3`, ...), each running one
  `dask worker` that advertises the resource `fabriclab-emu=1`.

Each node namespace reaches the bridge through a veth pair: `eth0` in the node, `vhead` / `vm{i}` in the
wire namespace (both ends are created directly in their namespaces, so no name or private address ever
exists in the root namespace).  On exit the cluster's processes are stopped (by the process groups it
created) and its namespaces deleted, whatever happened; `leftovers()` names whatever of it remains.

    with NamespaceCluster("dq1") as cluster:
        done = cluster.run_in(cluster.head, [sys.executable, "-c", SNIPPET], timeout_s=30)
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

#: The checkout the workers must import the project from.
ROOT = Path(__file__).resolve().parents[1]
#: The resource every machine's worker advertises (one emulation at a time per machine).
RESOURCE = "fabriclab-emu"
SCHEDULER_PORT = 8786  # each head namespace has its own port space: no clash with anything else
READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 5.0
#: `python -m dask ...` is the `dask` console script (dask.__main__) run by *this* interpreter: `shutil.which
#: ("dask")` may find a pyenv shim or another environment's script, which could import another `distributed`.
DASK = [sys.executable, "-m", "dask"]
_PREFIX = re.compile(r"[a-z][a-z0-9]{0,9}")

_WAIT_SNIPPET = textwrap.dedent(
    """
    import sys
    from distributed import Client
    address, count, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    with Client(address, timeout=timeout) as client:
        client.wait_for_workers(count, timeout=timeout)
        print(len(client.scheduler_info()["workers"]))
    """
)


def cluster_available() -> str | None:
    """None if a `NamespaceCluster` can run here; otherwise why not (tests skip with it)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    for module in ("distributed", "dask.__main__", "distributed.cli.dask_worker"):
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return f"{module} is not importable: install dask[distributed]"
    return None


def _ip_batch(lines: Sequence[str], netns: str | None = None) -> None:
    """Run `lines` as one `ip [-n netns] -batch -`; RuntimeError with ip's own message if it fails."""
    command = ["ip", *(["-n", netns] if netns else []), "-batch", "-"]
    done = subprocess.run(
        command, input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=30, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip() or done.stdout.strip()}")


def netns_names() -> set[str]:
    """The named network namespaces present now (`ip netns list`)."""
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10, check=False)
    return {line.split()[0] for line in done.stdout.splitlines() if line.strip()}


def _signal(proc: subprocess.Popen[Any], own_session: bool, sig: signal.Signals) -> None:
    """Send `sig` to `proc` — with `own_session` (it was started with start_new_session=True, so it leads a
    process group of its own) to its whole group.  Quiet if it is already gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if own_session:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)


def _stop(procs: Sequence[tuple[subprocess.Popen[Any], bool]], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM each (process, own_session), SIGKILL whatever still runs `grace_s` later, reap them all; of
    a group leader, once it is gone, the rest of its group too (a task's children).  A process already
    reaped is left alone (its pid could be anybody's by now)."""
    running = [(proc, own) for proc, own in procs if proc.poll() is None]
    for proc, own in running:
        _signal(proc, own, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc, own in running:
        try:
            proc.wait(max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            _signal(proc, own, signal.SIGKILL)
            proc.wait(30)
        if own:
            _signal(proc, own, signal.SIGKILL)


class NamespaceCluster:
    """A head namespace with a Dask scheduler and `machines` namespaces with one Dask worker each, on a
    shared bridge.  A context manager: built on entry, removed on exit."""

    def __init__(
        self,
        prefix: str,
        machines: int = 2,
        mtu: int = 9000,
        subnet: str = "10.213.0",
        keep_logs: bool = False,
    ) -> None:
        """`keep_logs`: keep `log_dir` (the processes' logs and the workers' scratch space) after a clean
        exit too; after a failure (on entry or in the `with` body) it is always kept, for the post-mortem."""
        if not _PREFIX.fullmatch(prefix):
            raise ValueError(f"prefix {prefix!r}: 1-10 lowercase letters or digits, a letter first")
        if not 1 <= machines <= 200:
            raise ValueError(f"machines={machines}: 1 to 200")
        if not re.fullmatch(r"\d{1,3}\.\d{1,3}\.\d{1,3}", subnet):
            raise ValueError(f"subnet {subnet!r}: the first three octets of a /24, e.g. 10.213.0")
        self.prefix = prefix
        self.mtu = mtu
        self.keep_logs = keep_logs
        self.subnet = subnet
        self.wire = f"{prefix}wire"
        self.head = f"{prefix}head"
        self.machines = [f"{prefix}m{i}" for i in range(machines)]
        self.ips: dict[str, str] = {self.head: f"{subnet}.1"}
        self.ips.update({ns: f"{subnet}.{2 + i}" for i, ns in enumerate(self.machines)})
        self.scheduler_address = f"tcp://{self.ips[self.head]}:{SCHEDULER_PORT}"
        #: The processes' logs and the workers' scratch space; made when the processes start.
        self.log_dir = Path(tempfile.gettempdir()) / f"fabriclab-cluster-{prefix}-{uuid.uuid4().hex[:8]}"
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        )
        self.scheduler_pid: int | None = None
        self.worker_pids: dict[str, int] = {}
        self._scheduler: subprocess.Popen[bytes] | None = None
        self._workers: dict[str, subprocess.Popen[bytes]] = {}
        #: popen_in's processes, each with whether it leads a session (and process group) of its own.
        self._others: list[tuple[subprocess.Popen[Any], bool]] = []
        self._created: list[str] = []  # namespaces this object made (and only these are deleted)
        self._logs: list[Any] = []

    @property
    def namespaces(self) -> list[str]:
        """Every namespace of this cluster: the wire, the head and the machines."""
        return [self.wire, self.head, *self.machines]

    # -- building ----------------------------------------------------------------------------------------

    def __enter__(self) -> NamespaceCluster:
        try:
            self._build_network()
            self._start_dask()
            self._wait_for_workers()
        except BaseException:
            self.close(remove_logs=False)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(remove_logs=exc_type is None and not self.keep_logs)

    def _build_network(self) -> None:
        taken = sorted(set(self.namespaces) & netns_names())
        if taken:
            # Someone else's (or a crashed run's): never reuse or delete what this object did not create.
            raise RuntimeError(f"namespaces {taken} already exist; choose another prefix or remove them")
        try:
            _ip_batch([f"netns add {ns}" for ns in self.namespaces])
        finally:
            # `ip -batch` stops at the first failure: the ones present now (absent before) are ours.
            present = netns_names()
            self._created = [ns for ns in self.namespaces if ns in present]
        mtu = self.mtu
        nodes = [("vhead", self.head), *((f"vm{i}", ns) for i, ns in enumerate(self.machines))]
        wire = [
            "link set lo up",
            f"link add br0 mtu {mtu} type bridge",
            # Each veth end is born in its namespace: `eth0` goes straight into the node's.
            *(
                f"link add {port} mtu {mtu} type veth peer name eth0 mtu {mtu} netns {ns}"
                for port, ns in nodes
            ),
            *(f"link set {port} master br0 up" for port, _ in nodes),
            "link set br0 up",
        ]
        _ip_batch(wire, self.wire)
        for _, ns in nodes:
            _ip_batch(
                ["link set lo up", f"addr add {self.ips[ns]}/24 dev eth0", f"link set eth0 mtu {mtu} up"], ns
            )

    def _spawn(self, ns: str, argv: Sequence[str], log_name: str) -> subprocess.Popen[bytes]:
        log = (self.log_dir / log_name).open("wb")
        self._logs.append(log)
        return subprocess.Popen(
            ["ip", "netns", "exec", ns, *argv],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=self.log_dir,
            start_new_session=True,
        )

    def _start_dask(self) -> None:
        self.log_dir.mkdir(mode=0o700)
        head_ip = self.ips[self.head]
        self._scheduler = self._spawn(
            self.head,
            [*DASK, "scheduler", "--host", head_ip, "--port", str(SCHEDULER_PORT), "--no-dashboard"],
            "scheduler.log",
        )
        self.scheduler_pid = self._scheduler.pid
        for ns in self.machines:
            # --no-nanny: the process we start *is* the worker (`ip netns exec` execs), so its pid and
            # group are the machine's Dask presence: SIGKILL is a machine loss, not a restart by a nanny,
            # and there is no nanny subprocess (and its extra second of start-up on a small box) to manage.
            worker_argv = [
                *DASK, "worker", self.scheduler_address,
                "--resources", f"{RESOURCE}=1",
                "--nthreads", "1", "--nworkers", "1", "--no-nanny",
                "--host", self.ips[ns], "--no-dashboard", "--name", ns,
                "--local-directory", str(self.log_dir / f"{ns}-scratch"),
                "--death-timeout", "60",
            ]  # fmt: skip
            proc = self._spawn(ns, worker_argv, f"{ns}.log")
            self._workers[ns] = proc
            self.worker_pids[ns] = proc.pid

    def _wait_for_workers(self) -> None:
        """Return once the scheduler has every worker (asked from the head namespace, as a client there
        would); RuntimeError with the logs' tails if a process dies first or READY_TIMEOUT_S passes."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        count = str(len(self.machines))
        last = ""
        while True:
            left = deadline - time.monotonic()
            argv = [sys.executable, "-c", _WAIT_SNIPPET, self.scheduler_address, count, f"{max(left, 1):.1f}"]
            waiter = subprocess.Popen(
                ["ip", "netns", "exec", self.head, *argv],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=self.env,
                start_new_session=True,
            )
            try:
                # Polled, not waited for: a scheduler or worker dying meanwhile is reported at once.
                while waiter.poll() is None and not self._dead_processes() and time.monotonic() < deadline:
                    time.sleep(0.1)
            finally:
                _stop([(waiter, True)], grace_s=1)
                _, err = waiter.communicate()
            if waiter.returncode == 0:
                return
            last = err.strip().splitlines()[-1] if err.strip() else last
            dead = self._dead_processes()
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited during start-up\n{self.log_tail()}")
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"{count} workers did not register with {self.scheduler_address} within "
                    f"{READY_TIMEOUT_S:.0f} s ({last})\n{self.log_tail()}"
                )
            time.sleep(0.5)  # the client gave up early (e.g. it could not connect yet): ask again

    def _dead_processes(self) -> list[str]:
        dead = []
        if self._scheduler is not None and self._scheduler.poll() is not None:
            dead.append(f"the scheduler (exit {self._scheduler.returncode})")
        dead += [
            f"worker {ns} (exit {p.returncode})" for ns, p in self._workers.items() if p.poll() is not None
        ]
        return dead

    def log_tail(self, lines: int = 15) -> str:
        """The last `lines` lines of every log of this cluster (for failure messages)."""
        parts = []
        for path in sorted(self.log_dir.glob("*.log")):
            try:
                text = path.read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            parts.append(f"--- {path}\n" + "\n".join(text))
        return "\n".join(parts)

    # -- using ----------------------------------------------------------------------------------------

    def popen_in(self, ns: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start `argv` in namespace `ns` (`ip netns exec`), by default in a session of its own and with the
        cluster's environment (PYTHONPATH has the checkout).  Still running at exit, it is stopped."""
        kwargs.setdefault("env", self.env)
        kwargs.setdefault("start_new_session", True)
        proc: subprocess.Popen[Any] = subprocess.Popen(["ip", "netns", "exec", ns, *argv], **kwargs)
        self._others.append((proc, bool(kwargs["start_new_session"])))
        return proc

    def run_in(
        self, ns: str, argv: Sequence[str], timeout_s: float, **kwargs: Any
    ) -> subprocess.CompletedProcess[Any]:
        """Run `argv` in namespace `ns` to completion (default: output captured as text, no check)."""
        kwargs.setdefault("env", self.env)
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        check = bool(kwargs.pop("check", False))
        return subprocess.run(["ip", "netns", "exec", ns, *argv], check=check, timeout=timeout_s, **kwargs)

    def kill_worker(self, ns: str) -> None:
        """SIGKILL machine `ns`'s worker (its whole process group) and reap it: the machine is lost."""
        proc = self._workers[ns]
        if proc.poll() is None:  # not yet reaped: its pid, and so its group, is still ours
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)

    def kill_scheduler(self) -> None:
        """SIGKILL the scheduler (its process group) and reap it: the cluster's coordinator is lost."""
        proc = self._scheduler
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)

    def worker_alive(self, ns: str) -> bool:
        """Whether machine `ns`'s worker process is still running."""
        return self._workers[ns].poll() is None

    # -- removing -------------------------------------------------------------------------------------

    def close(self, remove_logs: bool = False) -> None:
        """Stop every process this cluster started, then delete the namespaces it created (and, with
        `remove_logs`, `log_dir`).  Never raises for something already gone; safe to call twice."""
        procs = [*self._others, *((p, True) for p in self._workers.values())]
        if self._scheduler is not None:
            procs.append((self._scheduler, True))
        try:
            _stop(procs)
        except Exception as e:  # cleanup goes on whatever happens
            print(f"cluster {self.prefix}: stopping its processes: {e!r}", file=sys.stderr)
        for log in self._logs:
            with contextlib.suppress(OSError):
                log.close()
        self._logs.clear()
        for ns in reversed(self._created):
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30, check=False)
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            present = netns_names()
            self._created = [ns for ns in self._created if ns in present]
        if remove_logs:
            shutil.rmtree(self.log_dir, ignore_errors=True)
        elif self.log_dir.exists():
            print(f"cluster {self.prefix}: logs kept in {self.log_dir}", file=sys.stderr)

    def leftovers(self) -> list[str]:
        """This cluster's namespaces still present (whoever made them)."""
        present = netns_names()
        return [ns for ns in self.namespaces if ns in present]
