"""etcd as the issuer: a real 3-member cluster whose revisions order tokens across a killed leader,
until a restore from a snapshot issues one again and only the fence notices; nothing is left behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from labkit.clock import RealClock
from labkit.engines import etcd, etcd_cluster, servers
from labkit.errors import LabkitError, LeaseLost, StaleGeneration
from labkit.processes.live import draw
from labkit.processes.team import Team
from labkit.sim.history import Event, check
from polling import wait_for
from prerequisites import require
from test_postgres_server import gone, listening


def missing() -> str | None:
    """Why a cluster cannot start here (a Debian package or the etcd3gw client), or None."""
    try:
        etcd_cluster.require()
    except LabkitError as exc:
        return str(exc)
    return None


@pytest.fixture(scope="module")
def installed():
    """Skip loudly without etcd (fail under LABKIT_REQUIRE_ENGINES=1)."""
    require("etcd tests", missing(), "LABKIT_REQUIRE_ENGINES")


@pytest.fixture(scope="module")
def cluster(installed):
    """One cluster for the tests that allow it."""
    with etcd.Cluster() as started:
        yield started


def history(steps) -> list[Event]:
    return [Event(*step) for step in steps]


def test_tokens_strictly_increase_across_20_acquisitions_and_a_verified_leader_change(cluster):
    """20 turns with the leader SIGKILLed halfway: a different leader is followed by every member,
    the tokens climb across the kill, and the recorded history passes the checker."""
    story = etcd.story(20, cluster=cluster)
    assert len(story.tokens) == 20 and story.increasing
    assert story.before != story.after
    assert cluster.leader() not in (None, story.before)
    assert all(member.running for member in cluster.members)  # the old leader rejoined
    k = story.killed_before
    assert max(story.tokens[:k]) < min(story.tokens[k:])
    events = history(story.steps)
    assert [e.generation for e in events if e.action == "acquire"] == list(story.tokens)
    assert [e.outcome for e in events if e.action == "write"] == ["ok"] * 20
    assert [e.worker for e in events if e.action == "crash"] == ["etcd"]
    assert check(events) == []
    assert "✓ every token is above all before it" in story.text


def test_release_and_expiry_hand_the_lease_on_with_higher_tokens(cluster):
    """While A holds, B is refused; after A's release, and after B's lease expires without a
    keepalive, the next token is higher. etcd never ends a lease before its holder's deadline."""
    clock = RealClock()
    leases = etcd.EtcdLeases(cluster.endpoints, clock)
    a = leases.try_acquire("expiry", "A", 1)
    assert leases.try_acquire("expiry", "B", 1) is None
    assert leases.current("expiry").owner == "A"
    a = leases.renew(a)
    leases.release(a)
    with pytest.raises(LeaseLost):
        leases.release(a)
    b = leases.try_acquire("expiry", "B", 1)
    assert b.generation > a.generation
    while (c := leases.try_acquire("expiry", "C", 1)) is None:  # B sends no keepalive
        time.sleep(0.05)
    assert clock.now() >= b.expires_at
    assert c.generation > b.generation
    with pytest.raises(LeaseLost):
        leases.renew(b)
    leases.release(c)
    assert leases.current("expiry") is None


def test_leases_are_whole_seconds():
    """etcd grants TTLs in whole seconds: another TTL is refused, naming ttl."""
    leases = etcd.EtcdLeases(("127.0.0.1:1",), RealClock())
    with pytest.raises(LabkitError, match="ttl"):
        leases.try_acquire("job", "A", 0.4)


def test_a_restore_reissues_a_revision_and_the_fence_refuses_the_stale_write(cluster):
    """Restored from a snapshot taken before B's and C's grants, etcd gives D B's token again.
    With the fence, D's write is refused (C's token is remembered); without, it lands."""
    fenced = etcd.restore_story(cluster=cluster)
    b, c = fenced.issued
    assert fenced.before < b < c and fenced.reissued == b
    assert isinstance(fenced.refusal, StaleGeneration) and fenced.fence == c
    assert check(history(fenced.steps)) == []
    ax = draw(history(fenced.steps), params={"issuer": "etcd", "ttl": 1})  # as lesson 04 does
    assert {"D", "etcd", "fence"} <= {t.get_text() for t in ax.get_yticklabels()}
    bare = etcd.restore_story(fenced=False, cluster=cluster)
    assert bare.reissued == bare.issued[0] and bare.refusal is None
    kinds = {v.kind for v in check(history(bare.steps))}
    assert "stale_accepted" in kinds


def test_the_cluster_listens_on_loopback_only_and_is_gone_after_the_with_block(installed):
    """Clients and peers on 127.0.0.1, never the default ports; after the block, no member
    process and no folder is left."""
    with etcd.Cluster() as own:
        ports = [p for m in own.members for p in (m.port, m.peer_port)]
        assert not {2379, 2380} & set(ports)
        assert all(listening(port) == ["0100007F"] for port in ports)
        pids, folders = [m.process.pid for m in own.members], [m.folder for m in own.members]
    assert all(map(gone, pids)) and not any(f.exists() for f in folders)
    assert all(listening(port) == [] for port in ports)


PARENT = """
import time
from labkit.engines.etcd import Cluster
with Cluster() as cluster:
    print(*[m.process.pid for m in cluster.members], *[m.folder for m in cluster.members], flush=True)
    time.sleep(600)
"""


def start_parent() -> tuple[subprocess.Popen, list[int], list[Path]]:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    words = parent.stdout.readline().split()
    return parent, [int(w) for w in words[:3]], [Path(w) for w in words[3:]]


def test_an_interrupted_parent_stops_its_cluster_and_removes_its_folders(installed):
    """Ctrl-C in the parent: the KeyboardInterrupt stops every member on its way out."""
    parent, pids, folders = start_parent()
    parent.send_signal(signal.SIGINT)
    assert parent.wait(30) != 0
    assert all(map(gone, pids)) and not any(f.exists() for f in folders)


def test_a_sigkilled_parent_takes_its_cluster_along(installed):
    """SIGKILL the parent: PR_SET_PDEATHSIG stops the members; the next start sweeps the folders."""
    parent, pids, folders = start_parent()
    parent.kill()
    parent.wait()
    wait_for(lambda: all(map(gone, pids)), "the orphaned members to stop")
    assert set(map(str, folders)) <= set(servers.sweep())


def comm(pid: int) -> str:
    """The command name of ``pid`` (``etcd``, ``python``...), or "gone"."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "gone"


def chaos(folder, *flags: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "labkit.chaos", "--issuer", "etcd", "--workers", "3"]
    argv += ["--seed", "7", "--dir", str(folder), *flags]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_chaos_on_etcd_kills_its_leader_and_finds_no_violation(installed, tmp_path):
    """The real-process chaos run with etcd granting the leases: the nemesis SIGKILLs the leader
    twice (a new one is elected each time), and with the fence at the resource, nothing breaks."""
    run = chaos(tmp_path, "--seconds", "10", "--min-commits", "3")
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, out + err
    assert "violations: none" in out
    assert "leader SIGKILLed 2 times, a different leader elected 2 times" in out
    assert int(re.search(r"committed: (\d+)", out).group(1)) >= 3
    assert int(re.search(r"\((\d+) of a lease holder past its lease\)", out).group(1)) >= 1


def test_the_nemesis_waits_out_an_etcd_that_answers_later_than_a_workers_timeout(
    installed, tmp_path
):
    """While no member answers (all SIGSTOPped for 3 s, longer than a worker's 2 s: an election
    on a loaded machine), the chaos run's nemesis asks who holds the lease and gets its answer
    once etcd is back, instead of ending the run with Unreachable."""
    with etcd.Cluster() as cluster, Team(2, etcd=cluster.endpoints, root=tmp_path) as team:
        members, back = [m.process.pid for m in cluster.members], threading.Event()

        def resume() -> None:
            for pid in members:
                os.kill(pid, signal.SIGCONT)
            back.set()

        for pid in members:
            os.kill(pid, signal.SIGSTOP)
        timer = threading.Timer(3.0, resume)
        timer.start()
        try:
            assert team.holder() is None  # no worker started: nobody holds it
            assert back.is_set()  # and the answer came after etcd was back
        finally:
            timer.cancel()
            resume()


def test_an_interrupted_chaos_run_leaves_no_etcd_and_no_worker(installed, tmp_path):
    """SIGINT in the middle of a chaos run on etcd: its members and workers are all gone."""
    run = chaos(tmp_path, "--seconds", "60")

    def started() -> list[int]:
        below = servers.descendants(run.pid)
        names = [comm(pid) for pid in below]
        return below if names.count("etcd") == 3 and len(below) >= 6 else []

    below = wait_for(started, "the cluster and the workers")
    run.send_signal(signal.SIGINT)
    run.communicate(timeout=30)
    assert run.returncode != 0
    wait_for(lambda: all(map(gone, below)), "the members and workers to be gone")  # a worker
    # spawned at the very moment of the interrupt is stopped by PR_SET_PDEATHSIG, a moment later
    assert not list(Path("/tmp").glob(f"{servers.PREFIX}{run.pid}-*"))


def test_a_missing_binary_names_the_debian_package(monkeypatch, tmp_path):
    """Without etcd, the error names etcd-server; with etcd but no etcdctl, etcd-client. No
    folder is made."""
    monkeypatch.setattr(etcd_cluster, "BIN", tmp_path)
    with pytest.raises(servers.MissingBinary, match=r"apt-get install -y etcd-server") as caught:
        etcd.Cluster().start()
    assert (caught.value.name, caught.value.package) == ("etcd", "etcd-server")
    (tmp_path / "etcd").write_text("#!/bin/sh\n")
    (tmp_path / "etcd").chmod(0o755)
    with pytest.raises(servers.MissingBinary, match=r"apt-get install -y etcd-client") as caught:
        etcd.Cluster().start()
    assert caught.value.name == "etcdctl"
