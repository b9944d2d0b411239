"""A throwaway Redis primary and replica, whose replication link runs through a proxy we can stall.

Each ``redis-server`` listens on 127.0.0.1 only, on a free port (never 6379), keeps nothing on
disk but what replication needs, in its own temp folder, and dies with us (see ``servers``).

>>> with RedisPair() as pair:  # doctest: +SKIP
...     pair.proxy.stall()       # what the primary writes now never reaches the replica
...     pair.kill_primary()
...     pair.promote()           # the replica answers writes, without what was stalled
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from pathlib import Path

from labkit.engines.servers import ServerFailed, Throwaway, binary, free_port, kill_tree
from labkit.errors import LabkitError

__all__ = ["BIN", "LinkProxy", "RedisPair", "RedisServer", "client", "require"]

BIN = Path("/usr/bin")
PACKAGE = "redis-server"
SETTINGS = {
    "bind": "127.0.0.1",
    "save": "",  # no snapshots
    "appendonly": "no",
    "repl-diskless-sync-delay": "0",  # a replica's first sync starts at once, not after 5 s
    "repl-diskless-load": "on-empty-db",  # ... and is loaded from the socket, not a file
    "shutdown-timeout": "0",  # SIGTERM does not wait for a stalled replica to catch up
    "daemonize": "no",
    "logfile": "",  # to our log file
}


def require() -> None:
    """Raise MissingBinary (naming the Debian package) unless ``redis-server`` is installed."""
    binary("redis-server", BIN, PACKAGE)


def client(port: int, *, timeout: float = 5.0):
    """A redis-py client of 127.0.0.1:``port`` on ONE connection (``WAIT`` counts that
    connection's writes), answering str."""
    try:
        import redis
    except ImportError:
        raise LabkitError("Redis needs its Python client: pip install redis") from None
    return redis.Redis(
        "127.0.0.1",
        port,
        socket_timeout=timeout,
        decode_responses=True,
        single_connection_client=True,
    )


class RedisServer(Throwaway):
    """One ``redis-server`` in a temp folder; :meth:`client` talks to it."""

    kind = "redis"

    @property
    def log(self) -> Path:
        return self.folder / "server.log"

    _admin = None

    def client(self, **options):
        """A new one-connection client of this server (see :func:`client`)."""
        return client(self.port, **options)

    @property
    def admin(self):
        """This server's own client, for setup and checks (closed by :meth:`stop`)."""
        if self._admin is None:
            self._admin = self.client()
        return self._admin

    def stop(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            admin.close()
        super().stop()

    def _start(self) -> None:
        require()
        for attempt in range(3):  # a free port may be taken before the server binds it
            self.port = free_port()
            options = {**SETTINGS, "port": str(self.port), "dir": str(self.folder)}
            argv = [a for k, v in options.items() for a in (f"--{k}", v)]
            start = self.log.stat().st_size if self.log.exists() else 0
            self.spawn(BIN / "redis-server", *argv, log=self.log)
            try:
                return self.wait_until(
                    lambda at=start: self._ready(at), f"port {self.port}", self.log
                )
            except ServerFailed as exc:
                if "Address already in use" not in exc.log or attempt == 2:
                    raise

    def _ready(self, start: int) -> bool:
        with open(self.log, "rb") as log:
            log.seek(start)
            return b"Ready to accept connections" in log.read()

    def kill(self) -> None:
        """Crash the server (SIGKILL); its folder stays until :meth:`stop`."""
        if self.process is not None:
            kill_tree(self.process)
            self.process = None


class LinkProxy:
    """A TCP relay on 127.0.0.1 in a thread of ours: :meth:`stall` holds every byte both ways,
    :meth:`release` lets them through again.

    Why our own: freezing a server (SIGSTOP) loses nothing, since the kernel's socket buffer
    delivers the held bytes later, and ``iptables`` or ``tc`` needs root and changes the whole
    machine. Toxiproxy does exactly this, but it is a separate Go server that Debian does not
    package (its Python packages are only clients of it). A relay that stops reading is a page
    of ``selectors``.
    """

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._want_stall, self._stalled = threading.Event(), threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="labkit-redis-link", daemon=True)
        self._thread.start()

    def stall(self, timeout: float = 5.0) -> None:
        """Stop relaying; once this returns, not one more byte goes through either way."""
        self._want_stall.set()
        if not self._stalled.wait(timeout):
            raise LabkitError("the replication proxy did not stall in time")

    def release(self) -> None:
        """Relay again, the bytes held during the stall first."""
        self._want_stall.clear()

    def close(self) -> None:
        """Stop the relay thread and close every socket (idempotent)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5)
        self.listener.close()

    def _run(self) -> None:
        pairs: dict[socket.socket, socket.socket] = {}
        with selectors.DefaultSelector() as sel:
            sel.register(self.listener, selectors.EVENT_READ)
            try:
                while not self._stop.is_set():
                    self._step(sel, pairs)
            finally:
                for sock in pairs:
                    sock.close()

    def _step(self, sel, pairs) -> None:
        stall = self._want_stall.is_set()
        if stall != self._stalled.is_set():  # (un)register the relayed sockets, then say so
            for sock in pairs:
                if stall:
                    sel.unregister(sock)
                else:
                    sel.register(sock, selectors.EVENT_READ)
            (self._stalled.set if stall else self._stalled.clear)()
        for key, _ in sel.select(0.01):
            sock = key.fileobj
            if sock is self.listener:
                inner, _ = sock.accept()
                try:
                    outer = socket.create_connection(self.target, timeout=5)
                except OSError:  # the primary is gone: the replica will retry, and fail again
                    inner.close()
                    continue
                inner.settimeout(5)
                pairs.update({inner: outer, outer: inner})
                if not self._stalled.is_set():
                    sel.register(inner, selectors.EVENT_READ)
                    sel.register(outer, selectors.EVENT_READ)
                continue
            peer = pairs.get(sock)
            data = b""
            with contextlib.suppress(OSError):
                data = sock.recv(65536)
            if data and peer is not None:
                with contextlib.suppress(OSError):
                    peer.sendall(data)
                    continue
            for end in (sock, peer):  # one side closed (or failed): close both
                if end is not None and pairs.pop(end, None) is not None:
                    with contextlib.suppress(KeyError, ValueError):
                        sel.unregister(end)
                    end.close()


class RedisPair:
    """A primary, and a replica that is ``REPLICAOF`` the primary through a :class:`LinkProxy`.

    ``with RedisPair() as pair`` starts all three and waits until the link is up
    (``start_seconds`` says how long that took); leaving the block, by any path, a
    KeyboardInterrupt included, stops them all and removes their folders.
    """

    def __init__(self) -> None:
        self.primary, self.replica = RedisServer(), RedisServer()
        self.proxy: LinkProxy | None = None
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> RedisPair:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self, timeout: float = 30.0) -> RedisPair:
        """Start the primary, the proxy and the replica; return once the replica is in sync."""
        require()
        try:
            self._stack.enter_context(self.primary)
            self.proxy = LinkProxy(self.primary.port)
            self._stack.callback(self.proxy.close)
            self._stack.enter_context(self.replica)
            self.replica.admin.replicaof("127.0.0.1", self.proxy.port)
            self.replica.wait_until(self._linked, "the replica's link", self.replica.log, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _linked(self) -> bool:
        info = self.replica.admin.info("replication")
        return info.get("master_link_status") == "up" and not info.get("master_sync_in_progress")

    def stop(self) -> None:
        """Stop the replica, the proxy and the primary, whatever state they are in."""
        self._stack.close()

    def kill_primary(self) -> None:
        """SIGKILL the primary: whatever the replica had not received is gone."""
        self.primary.kill()

    def promote(self) -> None:
        """``REPLICAOF NO ONE`` on the replica: it stops following and answers writes."""
        self.replica.admin.replicaof("NO", "ONE")
