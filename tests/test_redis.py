"""Lesson 04 on a real Redis: after a failover the counter hands A's token to B, and only an epoch
from a durable authority lets the fence tell them apart.

Each run starts a throwaway primary and replica (skipped loudly without ``redis-server``, failed
under ``LABKIT_REQUIRE_ENGINES=1``) and must leave no server, no folder and no thread behind.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from polling import wait_for
from prerequisites import require

from labkit.engines import redis_pair, servers
from labkit.errors import LabkitError
from labkit.sim.history import Event, check, warnings

TTL = 0.4  # a short lease: the story runs in about 1 s


def missing_prerequisite() -> str | None:
    """Why the Redis tests cannot run here, or None."""
    try:
        redis_pair.require()
        import redis  # noqa: F401
    except (LabkitError, ImportError) as exc:
        return str(exc)
    return None


@pytest.fixture(scope="module")
def _redis():
    require("Redis tests", missing_prerequisite(), "LABKIT_REQUIRE_ENGINES")


needs_redis = pytest.mark.usefixtures("_redis")


def leftovers() -> tuple[set, set, set]:
    """Our redis-server children, our temp folders, and proxy threads, if any."""
    folders = set(Path(tempfile.gettempdir()).glob(f"{servers.PREFIX}{os.getpid()}-*"))
    threads = {t.name for t in threading.enumerate() if t.name == "labkit-redis-link"}
    return {p for p in servers.descendants(os.getpid()) if redis_server(p)}, folders, threads


def redis_server(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "redis-server"
    except OSError:
        return False


def gone(pid: int) -> bool:
    return servers.proc_state(pid) in ("gone", "Z")


@pytest.fixture(scope="module")
def runs(_redis):
    """One unprotected and one protected run, and what was left running before and after."""
    from labkit.engines.redis import story

    before = leftovers()
    played = {protected: story(protected, ttl=TTL) for protected in (False, True)}
    return played, before, leftovers()


def history(run) -> list[Event]:
    return [Event(*step) for step in run.steps]


@needs_redis
def test_the_replica_follows_through_the_proxy_which_holds_bytes_until_released():
    """Both servers answer on 127.0.0.1 only, keep no file but in their folder, and the
    replica is REPLICAOF the proxy; a write made during a stall arrives once it is released."""
    with redis_pair.RedisPair() as pair:
        primary, replica = pair.primary.client(), pair.replica.admin
        info = replica.info("replication")
        assert (info["master_host"], info["master_port"]) == ("127.0.0.1", pair.proxy.port)
        for server in (pair.primary, pair.replica):
            config = server.admin.config_get("*")
            assert (config["bind"], config["save"], config["appendonly"]) == ("127.0.0.1", "", "no")
            assert Path(config["dir"]) == server.folder and server.port != 6379
        pair.proxy.stall()
        primary.set("k", "stalled")
        assert primary.wait(1, 200) == 0 and replica.get("k") is None
        pair.proxy.release()
        assert primary.wait(1, 5000) == 1 and replica.get("k") == "stalled"
        primary.close()
        pids = [pair.primary.process.pid, pair.replica.process.pid]
    assert all(map(gone, pids))


@needs_redis
def test_unprotected_the_promoted_replica_hands_out_as_token_again(runs):
    """A's INCR gives 7, which WAIT on A's connection says no replica has; after the failover
    B's INCR gives 7 too, and the fence accepts every write, A's late one included."""
    run = runs[0][False]
    assert (run.replicated, run.waited) == (1, 0)
    assert run.a_token == run.b_token == 7 and run.reissued
    assert run.verdicts == (
        ("A", "INV-1", 7, "ok"), ("B", "INV-1", 7, "ok"),
        ("B", "INV-2", 7, "ok"), ("A", "INV-2", 7, "ok"),
    )  # fmt: skip


@needs_redis
def test_protected_the_epoch_orders_the_same_counter_and_the_fence_refuses_a(runs):
    """With epochs, the counter still repeats 7, but B's (2, 7) is above A's (1, 7): A's late
    write is refused."""
    run = runs[0][True]
    assert (run.replicated, run.waited) == (1, 0)
    assert (run.a_token, run.b_token) == ((1, 7), (2, 7)) and not run.reissued
    assert run.verdicts == (
        ("A", "INV-1", (1, 7), "ok"), ("B", "INV-1", (2, 7), "ok"),
        ("B", "INV-2", (2, 7), "ok"), ("A", "INV-2", (1, 7), "rejected"),
    )  # fmt: skip


@needs_redis
def test_the_checker_flags_the_unprotected_history_and_not_the_protected_one(runs):
    """The steps convert one for one into Events; the checker finds A's late write over B's in
    the unprotected run, and nothing in the protected one."""
    names = tuple(f.name for f in dataclasses.fields(Event))
    assert type(runs[0][False].steps[0])._fields == names
    found = check(history(runs[0][False]))
    assert {v.kind for v in found} == {"lost_update"}
    assert {w.kind for w in warnings(history(runs[0][False]))} == {"acted_after_expiry"}
    assert {(v.event.worker, v.event.target, v.event.generation) for v in found} == {
        ("A", "INV-2", 7)
    }
    assert check(history(runs[0][True])) == []


@needs_redis
def test_leases_end_at_send_time_plus_ttl_and_times_only_grow(runs):
    """The steps are in time order; an acquire's until minus the TTL, its send time, lies
    between the step before it and its answer."""
    for run in runs[0].values():
        times = [step.time for step in run.steps]
        assert times == sorted(times) and times[0] >= 0
        grants = [i for i, s in enumerate(run.steps) if s.action == "acquire"]
        assert [run.steps[i].worker for i in grants] == ["A", "B"]
        for i in grants:
            assert run.steps[i - 1].time <= run.steps[i].until - TTL <= run.steps[i].time
        assert run.total_seconds > run.start_seconds > 0


@needs_redis
def test_the_runs_leave_no_server_no_folder_and_no_thread(runs):
    """Every server pid of both runs is gone, with its folder and the proxy's thread."""
    played, before, after = runs
    assert after == before
    assert all(gone(pid) for run in played.values() for pid in run.server_pids)


PARENT = """
from labkit.engines.redis import story
story(False, ttl=1.0, pause=30)
"""


def signalled_mid_run(sig: int) -> tuple[subprocess.Popen, list[int]]:
    """A Python process playing the story, sent ``sig`` while A is paused (after the primary was
    killed); return it, ended, and the pids of every redis-server it ever had."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT])
    seen: list[int] = []  # the primary first (the replica starts once it is ready)

    def primary_killed():
        assert parent.poll() is None, "the run ended before the signal"
        alive = [p for p in servers.descendants(parent.pid) if redis_server(p)]
        seen.extend(p for p in alive if p not in seen)
        return seen and seen[0] not in alive and alive

    try:
        wait_for(primary_killed, "the run to kill its primary")
        parent.send_signal(sig)
        assert parent.wait(30) != 0
    finally:
        parent.kill()
    return parent, seen


def folders_of(pid: int) -> list[Path]:
    return list(Path(tempfile.gettempdir()).glob(f"{servers.PREFIX}{pid}-*"))


@needs_redis
def test_an_interrupt_mid_run_stops_both_servers_and_removes_the_folders():
    """Ctrl-C while A is paused: the replica stops too, and no temp folder is left."""
    parent, seen = signalled_mid_run(signal.SIGINT)
    assert len(seen) >= 2 and all(map(gone, seen))
    assert folders_of(parent.pid) == []


@needs_redis
def test_a_sigkilled_run_takes_its_servers_along_and_the_next_start_sweeps_its_folders():
    """SIGKILL while A is paused: PR_SET_PDEATHSIG stops the replica; the folders stay until
    the next start sweeps them."""
    parent, seen = signalled_mid_run(signal.SIGKILL)
    wait_for(lambda: all(map(gone, seen)), "the orphaned replica to stop")
    left = folders_of(parent.pid)
    assert left and set(map(str, left)) <= set(servers.sweep())
    assert folders_of(parent.pid) == []


def test_a_missing_binary_names_the_debian_package(monkeypatch, tmp_path):
    """Without redis-server, the story says which package to install and leaves no folder."""
    from labkit.engines.redis import story

    monkeypatch.setattr(redis_pair, "BIN", tmp_path)
    before = leftovers()
    with pytest.raises(servers.MissingBinary, match=r"apt-get install -y redis-server") as caught:
        story(False)
    assert (caught.value.name, caught.value.package) == ("redis-server", "redis-server")
    assert leftovers() == before


def test_an_epoch_is_taken_once_by_whoever_saw_the_last_one(tmp_path):
    """Two promotions that both saw epoch 1: the first commits 2, the second is refused."""
    import labkit
    from labkit.engines.redis import take_epoch

    db = labkit.connect(str(tmp_path / "authority.db"))
    assert take_epoch(db, "run", 0) == 1 and take_epoch(db, "run", 1) == 2
    with pytest.raises(LabkitError, match="epoch 1 of 'run' is not the last"):
        take_epoch(db, "run", 1)
    assert list(db["redis_epochs"].rows) == [{"name": "run", "epoch": 2}]


@needs_redis
def test_the_failover_loses_the_lease_too_and_only_the_fence_stops_the_damage(runs):
    """On a real Redis the promoted replica never saw A's SET NX PX either: B is granted the lease while
    A's still runs (two holders at once), in both runs; unprotected both hold 7 and A's late write lands,
    protected B's (2, 7) is above A's (1, 7) and the fence refuses A's write. The text says so, and that
    WAIT does not make Redis strongly consistent."""
    for protected, run in runs[0].items():
        b_granted, a_ends = run.overlap
        assert b_granted < a_ends
        late = [v for w, inv, _, v in run.verdicts if w == "A" and inv == "INV-2"]
        assert late == (["rejected"] if protected else ["ok"])
        assert "the lease was lost too" in run.text and "two holders at once" in run.text
        assert "does not make Redis strongly consistent" in run.text
        assert run.reissued is not protected
    assert "(the fence stopped it)" in runs[0][True].text
