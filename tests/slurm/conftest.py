"""The ``slurm_cluster`` fixture: one real SLURM cluster (tests/slurm/cluster.py) for the whole session."""
from __future__ import annotations

import shutil

import pytest
from cluster import ClusterUnavailable, SlurmCluster, hosts_resolve, missing_reason


@pytest.fixture(scope="session")
def slurm_cluster():
    """A started cluster; the test is skipped, with the reason, where SLURM cannot run."""
    reason = missing_reason()
    if reason:
        pytest.skip(f"no local SLURM cluster: {reason}")
    cluster = SlurmCluster()
    try:
        cluster.start()
    except ClusterUnavailable as err:
        shutil.rmtree(cluster.root, ignore_errors=True)
        pytest.skip(f"the local SLURM cluster did not come up: {err}")
    yield cluster
    cluster.stop()
    shutil.rmtree(cluster.root, ignore_errors=True)


@pytest.fixture
def two_node_cluster(slurm_cluster):
    """The cluster, where its emulated nodes node1/node2 resolve to this machine."""
    if not hosts_resolve():
        pytest.skip("node1/node2 do not resolve to 127.0.0.1: add '127.0.0.1 node1 node2' to /etc/hosts (.ci/run does)")
    return slurm_cluster
