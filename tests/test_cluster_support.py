"""`tests.cluster_support.NamespaceCluster`: machines as network namespaces on one bridge, a Dask scheduler
in the head namespace and one worker per machine, each in its own namespace, all gone afterwards."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.cluster_support import RESOURCE, NamespaceCluster, cluster_available
from tests.emulation_support import require_emulation, unique_prefix

# Run in the head namespace: what the scheduler knows of its workers, and where a task pinned to each runs.
PROBE = """
import json, os, sys
from distributed import Client

def where():
    import os
    from distributed import get_worker
    worker = get_worker()
    return {"ino": os.stat("/proc/self/ns/net").st_ino, "address": worker.address, "name": worker.name}

with Client(sys.argv[1], timeout=20) as client:
    workers = client.scheduler_info()["workers"]
    seen = {a: {"name": w["name"], "resources": w["resources"]} for a, w in workers.items()}
    futures = {
        a: client.submit(where, workers=[a], resources={sys.argv[2]: 1}, pure=False)
        for a in workers
    }
    ran = {a: f.result(timeout=20) for a, f in futures.items()}
print(json.dumps({"head_ino": os.stat("/proc/self/ns/net").st_ino, "workers": seen, "ran": ran}))
"""


def _running(pid: int) -> bool:
    """Whether `pid` is still a Dask process (a reaped pid may have been reused by something else)."""
    try:
        return b"dask" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@pytest.mark.emulation
def test_each_machine_is_a_namespace_with_its_own_worker_and_nothing_is_left() -> None:
    require_emulation(cluster_available())
    cluster = NamespaceCluster(unique_prefix("d"), machines=2)
    with cluster:
        assert cluster.scheduler_address == "tcp://10.213.0.1:8786"
        head, (m0, m1) = cluster.head, cluster.machines
        assert cluster.ips == {head: "10.213.0.1", m0: "10.213.0.2", m1: "10.213.0.3"}
        probe = [sys.executable, "-c", PROBE, cluster.scheduler_address, RESOURCE]
        done = cluster.run_in(head, probe, timeout_s=60)
        assert done.returncode == 0, done.stderr[-3000:] + cluster.log_tail()
        got = json.loads(done.stdout)
        by_name = {w["name"]: (address, w) for address, w in got["workers"].items()}
        assert sorted(by_name) == sorted(cluster.machines)
        for ns, (address, worker) in by_name.items():
            assert address.startswith(f"tcp://{cluster.ips[ns]}:"), (ns, address)
            assert worker["resources"] == {RESOURCE: 1}, worker
            ran = got["ran"][address]
            assert ran["address"] == address and ran["name"] == ns, ran
            assert ran["ino"] == os.stat(f"/run/netns/{ns}").st_ino, (ns, ran)
        assert all(cluster.worker_alive(m) for m in cluster.machines)
        inodes = [got["ran"][by_name[ns][0]]["ino"] for ns in cluster.machines]
        head_ino = got["head_ino"]
        assert head_ino == os.stat(f"/run/netns/{head}").st_ino
        assert len({*inodes, head_ino, os.stat("/proc/self/ns/net").st_ino}) == 4, (inodes, head_ino)
        pids = [*cluster.worker_pids.values(), cluster.scheduler_pid]
    assert cluster.leftovers() == []
    assert not any(_running(pid) for pid in pids if pid is not None)
