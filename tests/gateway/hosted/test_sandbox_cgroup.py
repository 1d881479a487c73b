"""The sandbox's cgroup layout on a cgroup v2 and a v1 tree (files in a directory standing for /sys/fs/cgroup;
the kernel side of the v1 tree is exercised by the hostile-tenant suite, on this machine's v1 hierarchies)."""

from __future__ import annotations

from pathlib import Path

from gateway.hosted.sandbox.cgroup import CgroupLimits, CgroupTree

LIMITS = CgroupLimits(memory_bytes=256 << 20, processes=19, cpus=1.5)


def test_v2_groups_sit_under_the_gateways_own_with_every_limit(tmp_path):
    root = tmp_path / "cgroup"
    own = root / "kubepods" / "pod1"
    own.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (own / "cgroup.procs").write_text("")
    proc = tmp_path / "self_cgroup"
    proc.write_text("0::/kubepods/pod1\n")
    tree = CgroupTree.detect(root, proc)
    assert tree is not None and tree.version == 2
    assert (own / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    group = tree.create("sandbox-7", LIMITS)
    path = own / "gpt-oss-sandboxes" / "sandbox-7"
    assert (path / "memory.max").read_text() == str(256 << 20) and (path / "memory.swap.max").read_text() == "0"
    assert (path / "pids.max").read_text() == "19" and (path / "cpu.max").read_text() == "150000 100000"
    (path / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\n")
    assert group.cpu_seconds() == 2.5
    assert tree.names() == ["sandbox-7"]


def test_v1_groups_span_the_four_hierarchies(tmp_path):
    root = tmp_path / "cgroup"
    lines = []
    for number, controller in enumerate(("memory", "pids", "cpu", "cpuacct")):
        (root / controller / "docker" / "c1").mkdir(parents=True)
        (root / controller / "cgroup.procs").write_text("")
        lines.append(f"{number + 2}:{controller}:/docker/c1")
    proc = tmp_path / "self_cgroup"
    proc.write_text("\n".join([*lines, "0::/"]) + "\n")
    tree = CgroupTree.detect(root, proc)
    assert tree is not None and tree.version == 1
    group = tree.create("sandbox-3", LIMITS)
    memory = root / "memory" / "docker" / "c1" / "gpt-oss-sandboxes" / "sandbox-3"
    assert (memory / "memory.limit_in_bytes").read_text() == str(256 << 20)
    cpu = root / "cpu" / "docker" / "c1" / "gpt-oss-sandboxes" / "sandbox-3"
    assert (cpu / "cpu.cfs_quota_us").read_text() == "150000"
    cpuacct = root / "cpuacct" / "docker" / "c1" / "gpt-oss-sandboxes" / "sandbox-3"
    (cpuacct / "cpuacct.usage").write_text("3000000000")
    assert group.cpu_seconds() == 3.0


def test_no_writable_tree_means_no_cgroup(tmp_path):
    proc = tmp_path / "self_cgroup"
    proc.write_text("0::/\n")
    assert CgroupTree.detect(tmp_path / "absent", proc) is None
    assert CgroupTree.detect(tmp_path, Path("/nonexistent/cgroup")) is None
