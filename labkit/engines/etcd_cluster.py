"""A throwaway 3-member etcd cluster on loopback, with the hands to kill its leader and restore it.

Each member is a :class:`~labkit.engines.servers.Throwaway` (its own temp folder, a free client
and peer port on 127.0.0.1, ``PR_SET_PDEATHSIG``); :class:`Cluster` starts them together and
stops them on every exit path. Heartbeat and election timeouts are cut to 50/500 ms, which suits
loopback: a new leader is elected well under a second after the old one dies, and the shortest
lease etcd grants becomes 1 s. Members are stopped with SIGKILL: the data is thrown away anyway,
and a leader asked to stop politely first tries to hand over its role to peers already gone.

>>> with Cluster() as cluster:  # doctest: +SKIP
...     old = cluster.leader()
...     cluster.kill_leader()
...     new = cluster.wait_leader(other_than=old)
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import time
import uuid
from pathlib import Path

from labkit.clock import RealClock
from labkit.engines.servers import ServerFailed, Throwaway, binary, free_port, kill_tree
from labkit.errors import BadArgument, LabkitError

__all__ = ["BIN", "Cluster", "LeaderKiller", "Member", "client", "for_chaos", "require"]

BIN = Path("/usr/bin")
_CLOCK = RealClock()  # real servers: real time, read through the one clock protocol
TIMING = ("--heartbeat-interval", "50", "--election-timeout", "500")
ELECTION = 10.0  # seconds within which a loaded 2-core machine elects a leader (0.8 s when quiet)


def _argv(flags: dict) -> list:
    """``{"--name": "a", ...}`` as a command line's words: ``["--name", "a", ...]``, in order."""
    return [word for pair in flags.items() for word in pair]


def require() -> None:
    """Raise MissingBinary (naming the Debian package) or LabkitError unless etcd can run here."""
    binary("etcd", BIN, "etcd-server")
    binary("etcdctl", BIN, "etcd-client")
    try:
        import etcd3gw  # noqa: F401
    except ImportError:
        raise LabkitError("the etcd3gw client is missing: pip install 'labkit[engines]'") from None


def client(endpoint: str, timeout: float = 1.0):
    """An etcd3gw client of one member's HTTP gateway (``endpoint`` is ``127.0.0.1:PORT``)."""
    from etcd3gw.client import Etcd3Client

    host, port = endpoint.rsplit(":", 1)
    return Etcd3Client(host, int(port), timeout=timeout, api_path="/v3/")


class Member(Throwaway):
    """One etcd member: ``name``, its ``port`` (clients) and ``peer_port``, in a cluster whose
    members are ``cluster`` (``name=peer URL,...``) and whose ``token`` names it."""

    kind = "etcd"
    stop_signal = death_signal = signal.SIGKILL

    def __init__(self, name: str, port: int, peer_port: int, cluster: str, token: str) -> None:
        super().__init__()
        self.name, self.port, self.peer_port = name, port, peer_port
        self.cluster, self.token = cluster, token

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def log(self) -> Path:
        return self.folder / "etcd.log"

    def _start(self) -> None:
        require()
        self.launch()

    def launch(self) -> None:
        """Start ``etcd`` on the data folder (a new one joins the cluster; an old one rejoins)."""
        client_url, peer_url = f"http://{self.endpoint}", f"http://127.0.0.1:{self.peer_port}"
        flags = {
            "--name": self.name,
            "--data-dir": self.data,
            "--listen-client-urls": client_url,
            "--advertise-client-urls": client_url,
            "--listen-peer-urls": peer_url,
            "--initial-advertise-peer-urls": peer_url,
            "--initial-cluster": self.cluster,
            "--initial-cluster-token": self.token,
            "--initial-cluster-state": "new",
        }
        log_flags = ("--logger", "zap", "--log-level", "warn")
        self.spawn(BIN / "etcd", *_argv(flags), *TIMING, *log_flags, log=self.log)

    def kill(self) -> None:
        """SIGKILL the member; its data stays, for :meth:`launch` to start it again."""
        if self.process is not None:
            kill_tree(self.process)
            self.process = None

    def status(self) -> dict | None:
        """The member's ``/v3/maintenance/status`` (its ``member_id`` and the ``leader`` it
        follows), or None if it does not answer within 0.5 s."""
        if not self.running:
            return None
        try:
            found = client(self.endpoint, 0.5).status()
        except Exception:  # refused, timed out, or no leader yet: not an answer
            return None
        return {"member_id": found["header"]["member_id"], "leader": found.get("leader", "0")}


class Cluster:
    """``size`` etcd members on 127.0.0.1 (never the default ports 2379/2380), started by
    ``with`` or :meth:`start`, stopped and removed by :meth:`stop` on every exit path.
    ``started_in`` is how many seconds the start took."""

    def __init__(self, size: int = 3) -> None:
        self.size, self.members, self.started_in = size, [], None

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @property
    def endpoints(self) -> tuple[str, ...]:
        """Every member's ``127.0.0.1:PORT``, the running ones and the killed ones."""
        return tuple(m.endpoint for m in self.members)

    def start(self, seconds: float = 30.0) -> Cluster:
        """Start every member and wait until they all follow one leader."""
        require()
        began, ports = _CLOCK.now(), set()
        while len(ports) < 2 * self.size:
            ports |= {free_port()} - {2379, 2380}
        ports = sorted(ports)
        names = [f"m{i}" for i in range(self.size)]
        peers = ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in zip(names, ports[1::2]))
        token = f"labkit-{uuid.uuid4().hex[:8]}"
        try:
            for name, port, peer in zip(names, ports[::2], ports[1::2]):
                self.members.append(Member(name, port, peer, peers, token).start())
            self.wait_leader(seconds=seconds)
        except BaseException:
            self.stop()
            raise
        self.started_in = _CLOCK.now() - began
        return self

    def stop(self) -> None:
        """Kill every member and remove its folder (even if an interrupt comes meanwhile)."""
        members, self.members = self.members, []
        try:
            for member in members:
                member.stop()
        finally:
            for member in members:  # an interrupt during the loop: still stop the rest
                with contextlib.suppress(BaseException):
                    member.stop()

    def leader(self) -> str | None:
        """The member ID of the leader that every running member follows, or None."""
        seen = [member.status() for member in self.members if member.running]
        leaders = {s["leader"] for s in seen if s is not None}
        if None in seen or len(leaders) != 1 or leaders == {"0"} or len(seen) * 2 <= self.size:
            return None
        return leaders.pop()

    def version(self) -> str:
        """The etcd version that a running member reports (``/v3/maintenance/status``)."""
        member = next(m for m in self.members if m.running)
        return client(member.endpoint).status()["version"]

    def member(self, member_id: str) -> Member:
        """The running member whose ID is ``member_id``."""
        for member in self.members:
            if (status := member.status()) and status["member_id"] == member_id:
                return member
        raise LabkitError(f"no running member has ID {member_id}")

    def wait_leader(self, other_than: str | None = None, seconds: float = ELECTION) -> str:
        """Wait until every running member follows one leader (not ``other_than``); return it."""
        deadline = _CLOCK.now() + seconds
        while _CLOCK.now() < deadline:
            for member in self.members:
                if member.process is not None and member.process.poll() is not None:
                    raise ServerFailed("an etcd member exited", member.log.read_text()[-2000:])
            if (found := self.leader()) not in (None, other_than):
                return found
            time.sleep(0.02)
        logs = "".join(m.log.read_text()[-600:] for m in self.members if m.log.exists())
        raise ServerFailed(f"etcd elected no leader (other than {other_than}) in {seconds} s", logs)

    def kill_leader(self) -> tuple[str, Member]:
        """SIGKILL the current leader; return its ID and its member (to :meth:`Member.launch`)."""
        old = self.leader() or self.wait_leader()
        victim = self.member(old)
        victim.kill()
        return old, victim

    def snapshot(self, path: str | Path) -> Path:
        """Save a snapshot of the cluster's data to ``path`` (``etcdctl snapshot save``)."""
        member = next(m for m in self.members if m.running)
        member.run(BIN / "etcdctl", "--endpoints", member.endpoint, "snapshot", "save", path)
        return Path(path)

    def restore(self, path: str | Path, seconds: float = 30.0) -> str:
        """Kill every member, restore each one's data from the snapshot at ``path`` (the same
        members, ports and cluster token), start them again; return the new leader's ID."""
        for member in self.members:
            member.kill()
            shutil.rmtree(member.data, ignore_errors=True)
            flags = {
                "--name": member.name,
                "--data-dir": member.data,
                "--initial-cluster": member.cluster,
                "--initial-cluster-token": member.token,
                "--initial-advertise-peer-urls": f"http://127.0.0.1:{member.peer_port}",
            }
            member.run(BIN / "etcdctl", "snapshot", "restore", path, *_argv(flags))
        for member in self.members:
            member.launch()
        return self.wait_leader(seconds=seconds)


class LeaderKiller:
    """A chaos nemesis's hand on etcd, called with the run's time (``killer(now)``): at each
    time in ``at`` it SIGKILLs the leader, then watches the survivors follow a different one
    (``elected_in`` seconds, one per kill), and ``down`` seconds after the kill starts the
    member again. It never waits: a kill comes when the last victim is back and re-elected."""

    def __init__(self, cluster: Cluster, at, down: float = 1.0) -> None:
        self.cluster, self.plan, self.down = cluster, sorted(at), down
        self.kills, self.restarts, self.elected_in, self._victim = 0, 0, [], None

    def __call__(self, now: float) -> None:
        if self._victim is not None:
            old, member, killed = self._victim
            if len(self.elected_in) < self.kills and self.cluster.leader() not in (None, old):
                self.elected_in.append(_CLOCK.now() - killed)
            if not member.running and _CLOCK.now() >= killed + self.down:
                member.launch()
                self.restarts += 1
            if member.running and len(self.elected_in) == self.kills:
                self._victim = None
        elif self.plan and now >= self.plan[0]:
            self.plan.pop(0)
            old, member = self.cluster.kill_leader()
            self.kills, self._victim = self.kills + 1, (old, member, _CLOCK.now())

    @property
    def text(self) -> str:
        slowest = f" (in {max(self.elected_in):.2f} s at most)" if self.elected_in else ""
        elected = f"a different leader elected {len(self.elected_in)} times{slowest}"
        return f"etcd: leader SIGKILLed {self.kills} times, {elected}, {self.restarts} restarted"


@contextlib.contextmanager
def for_chaos(issuer: str, seconds: float):
    """A chaos run's issuer: ``(endpoints, hand)``, where ``hand(now)`` is called by the nemesis.
    ``"sqlite"``: no endpoints, a hand that does nothing; ``"etcd"``: a started cluster's
    endpoints and a LeaderKiller at 50% and 75% of the run's ``seconds``; stopped at the end."""
    if issuer not in ("sqlite", "etcd"):
        raise BadArgument("issuer", f"must be 'sqlite' or 'etcd', got {issuer!r}")
    if issuer == "sqlite":
        yield (), lambda now: None
        return
    with Cluster() as cluster:
        yield cluster.endpoints, LeaderKiller(cluster, (0.5 * seconds, 0.75 * seconds))
