"""etcd as the issuer: the token is the lock key's ``create_revision``, the lease ID the holder.

:class:`EtcdLeases` speaks :class:`~labkit.lease.LeaseAuthority`'s language on a real cluster,
through ``etcd3gw`` (the HTTP gateway; synchronous, so it works inside a notebook's kernel):

* acquire: grant a lease of ``ttl`` whole seconds, then one transaction, "create the lock key
  with this lease only if its create_revision is 0". Did I win? The transaction's ``succeeded``.
  The token is the revision it wrote, which the key keeps as its ``create_revision``.
* renew: a keepalive of the lease; release: revoke it (the key goes with it); expiry: no
  keepalive for ``ttl`` seconds.

Revisions only grow while the cluster lives, across leaders too. Restored from an old
snapshot, it issues some of them again: only the fence at the resource notices.
"""

from __future__ import annotations

import base64
import contextlib
import time
from dataclasses import dataclass, replace

from labkit.clock import read_clock
from labkit.engines.etcd_cluster import ELECTION, client
from labkit.errors import BadArgument, Busy, LabkitError, LeaseLost, check_number
from labkit.lease import Lease, LeaseAuthority

__all__ = ["EtcdLease", "EtcdLeases", "KEYS", "Unreachable", "authority"]

KEYS = "labkit/lock/"  # + the lease name: the lock key


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class Unreachable(Busy):
    """No etcd member answered for ``timeout_ms`` (down, or electing a leader); retry."""

    def __init__(self, timeout_ms: int) -> None:
        super().__init__(timeout_ms)
        self.args = (f"no etcd member answered in {timeout_ms} ms (down, or electing); retry",)


@dataclass(frozen=True, slots=True)
class EtcdLease(Lease):
    """A :class:`~labkit.lease.Lease` held in etcd: ``generation`` is the key's create_revision,
    ``lease_id`` etcd's lease, ``since`` when the grant (or keepalive) was won, on the holder's
    clock. ``expires_at`` is the send time of the grant or keepalive plus ``ttl``: etcd ends the
    lease no earlier than that."""

    lease_id: int
    since: float


class EtcdLeases:
    """Leases on the etcd members at ``endpoints`` (``127.0.0.1:PORT``), read with ``clock``.

    A member that does not answer is skipped for the next; when none answers, or while a new
    leader is elected, a call raises :class:`~labkit.errors.Busy` (retry it)."""

    def __init__(self, endpoints, clock, *, timeout: float = 2.0) -> None:
        if not endpoints:
            raise LabkitError("EtcdLeases needs the endpoints of at least one etcd member")
        self.clients = [client(e, min(timeout, 0.5)) for e in endpoints]
        self.clock, self.timeout = clock, check_number(timeout, "timeout", positive=True)

    def _call(self, path: str, body: dict) -> dict:
        """POST ``body`` to the gateway's ``/v3/path``, trying member after member for up to
        ``timeout`` seconds (an election takes about 0.8 s) before raising Unreachable."""
        from etcd3gw import exceptions as bad

        deadline = read_clock(self.clock) + self.timeout
        while read_clock(self.clock) < deadline:
            gateway = self.clients[0]
            try:
                return gateway.post(gateway.get_url(path), json=body)
            except (bad.ConnectionFailedError, bad.ConnectionTimeoutError, bad.InternalServerError):
                self.clients.append(self.clients.pop(0))  # down, or electing: try the next member
                time.sleep(0.01)
            except bad.Etcd3Exception as exc:
                if "not found" in (text := f"{exc.detail_text} {exc}"):  # an expired lease
                    raise LookupError(text) from None
                raise LabkitError(f"etcd refused {path}: {text}") from None
        raise Unreachable(int(self.timeout * 1000))

    def try_acquire(self, name: str, owner: str, ttl: float) -> EtcdLease | None:
        """A lease on ``name`` for ``owner``, with the next revision as its token, or None."""
        ttl = check_number(ttl, "ttl", positive=True)
        if ttl != int(ttl):
            raise BadArgument("ttl", f"etcd grants leases of whole seconds, got {ttl!r}")
        ttl = int(ttl)
        sent = read_clock(self.clock)
        lease = int(self._call("lease/grant", {"TTL": ttl, "ID": 0})["ID"])
        key = _b64(KEYS + name)
        txn = {
            "compare": [{"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": 0}],
            "success": [{"request_put": {"key": key, "value": _b64(owner), "lease": lease}}],
        }
        try:
            done = self._call("kv/txn", txn)
        except LookupError:  # the lease ran out before the transaction: we did not win
            return None
        if not done.get("succeeded"):
            with contextlib.suppress(LookupError, Busy):
                self._call("kv/lease/revoke", {"ID": lease})
            return None
        revision = int(done["header"]["revision"])  # the put's revision: the key's create_revision
        since = read_clock(self.clock)  # won: at the put's answer, not before it was sent (a holder
        # frozen before sending wins later, after another's renewal that the journal must precede)
        return EtcdLease(name, owner, revision, sent + ttl, ttl, lease, since)

    def renew(self, lease: EtcdLease) -> EtcdLease:
        """``lease`` kept alive for ``ttl`` more seconds, or LeaseLost if it ran out."""
        sent = read_clock(self.clock)
        try:
            kept = self._call("lease/keepalive", {"ID": lease.lease_id})["result"]
        except LookupError:
            kept = {}
        if int(kept.get("TTL", 0)) <= 0:  # etcd leaves TTL out of a lease that ran out
            raise LeaseLost(lease.name, lease.owner, lease.generation)
        return replace(lease, expires_at=sent + lease.ttl, since=sent)

    def release(self, lease: EtcdLease) -> None:
        """Revoke ``lease`` (its key goes with it), or LeaseLost if it had run out."""
        try:
            self._call("kv/lease/revoke", {"ID": lease.lease_id})
        except LookupError:
            raise LeaseLost(lease.name, lease.owner, lease.generation) from None

    def current(self, name: str) -> Lease | None:
        """The lease on ``name`` that etcd holds now (its owner and token), or None."""
        found = self._call("kv/range", {"key": _b64(KEYS + name)}).get("kvs", [])
        if not found:
            return None
        kv, now = found[0], read_clock(self.clock)
        owner = base64.b64decode(kv["value"]).decode()
        try:  # etcd rounds what is left down to whole seconds (and omits a 0)
            live = self._call("kv/lease/timetolive", {"ID": int(kv.get("lease", 0))})
        except LookupError:
            return None
        left, ttl = int(live.get("TTL", 0)), int(live.get("grantedTTL", 1))
        return (
            Lease(name, owner, int(kv["create_revision"]), now + left, ttl) if left >= 0 else None
        )


def authority(db, clock, etcd=(), *, looking=False) -> EtcdLeases | LeaseAuthority:
    """The lease authority: etcd at the endpoints ``etcd`` if any, else ``db``'s leases table.
    A worker's etcd calls give up after 2 s (it retries); ``looking``, a chaos run's nemesis,
    which only asks who holds the lease and has none to lose by waiting, waits out an election
    as long as :meth:`Cluster.wait_leader` does."""
    if not etcd:
        return LeaseAuthority(db, clock)
    return EtcdLeases(etcd, clock, timeout=ELECTION if looking else 2.0)
