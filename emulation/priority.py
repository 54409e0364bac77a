"""The emulator's own processes run at Open vSwitch's priority.

`ovs-ctl` starts ovs-vswitchd and ovsdb-server at nice -10 (its `--ovs-vswitchd-priority` default) so
that other work on the machine does not starve the datapath.  With the kernel's autogroup scheduling
(`/proc/sys/kernel/sched_autogroup_enabled`, on in Debian's kernels) a per-process nice value only
counts inside the process's session: each session shares the CPU equally, whatever its members' nice.
`ovs-ctl` daemonises OVS into a session of its own, so its -10 bought nothing: beside
`stress-ng --cpu 2` on 2 cores the userspace datapath fell behind and a k=4 permutation lost 25–77 % of
its packets (`docs/development.md#the-suite-under-load`).  Here the whole session gets the priority
(`/proc/PID/autogroup`) as well as each thread.

What runs at `EMULATOR_NICE`: the OVS daemons the emulator uses (the system's, which ovs-ctl meant to run
there, and each shard's), the controller process, and the traffic agents inside host namespaces.  It
needs CAP_SYS_NICE (root has it; the compose services add it); without it everything runs at its
normal priority and the emulator's headroom check reports any overload as before.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

EMULATOR_NICE = -10  # ovs-ctl's default for the OVS daemons
OVS_RUNDIR = Path(os.environ.get("OVS_RUNDIR", "/var/run/openvswitch"))
OVS_DAEMONS = ("ovsdb-server", "ovs-vswitchd")


def _write(path: str, text: str) -> bool:
    try:
        with open(path, "w", encoding="ascii") as f:
            f.write(text)
    except OSError:
        return False
    return True


def prioritise_pid(pid: int) -> bool:
    """Run process `pid` (all its threads) at `EMULATOR_NICE`, and its session too when it leads one (a
    daemon); False where that was not allowed or the process is gone."""
    done = True
    try:
        threads = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return False
    for tid in threads:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, EMULATOR_NICE)
        except OSError:
            done = False
    if _leads_own_session(pid):
        done = _write(f"/proc/{pid}/autogroup", str(EMULATOR_NICE)) and done
    return done


def _leads_own_session(pid: int) -> bool:
    """True if `pid`'s session is its own: it leads it, or its leader runs the same program (OVS's
    `--monitor` parent).  Never another session's group: that would lift unrelated work too."""
    try:
        sid = os.getsid(pid)
        return sid == pid or os.readlink(f"/proc/{sid}/exe") == os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False


def prioritise_ovs(rundir: Path = OVS_RUNDIR, daemons: Iterable[str] = OVS_DAEMONS) -> bool:
    """The OVS daemons whose pidfiles are in `rundir`, at `EMULATOR_NICE` (see the module docstring)."""
    done = True
    for name in daemons:
        try:
            pid = int((rundir / f"{name}.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            done = False
            continue
        done = prioritise_pid(pid) and done
    return done


def raise_priority() -> None:
    """In a child before exec that leads its own session: the session and the process at
    `EMULATOR_NICE`; quietly unchanged where that is not allowed."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, EMULATOR_NICE)
    if os.getsid(0) == os.getpid():
        _write("/proc/self/autogroup", str(EMULATOR_NICE))


def prioritised(argv: Sequence[str]) -> list[str]:
    """`argv` run at `EMULATOR_NICE` (through nice(1), which execs the command and so keeps the PID)."""
    if os.geteuid() != 0:
        return list(argv)
    return ["nice", "-n", str(EMULATOR_NICE), *argv]
