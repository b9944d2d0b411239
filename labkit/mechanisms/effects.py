"""Effects outside the database: a file that can be fenced, an email and a payment that cannot.

* :class:`FencedFileStore`: file contents on disk, the file table in SQLite;
  a write commits only through the fence, so a stale generation writes nothing.
* :class:`EmailProvider` and :class:`PaymentProvider`: fake external services
  (each in its own SQLite file) that honour idempotency keys but know nothing
  of generations: a stale worker that calls them directly still gets through.
* :class:`Outbox`: the intent is written inside the fenced transaction under an
  operation key; :meth:`Outbox.relay` delivers pending rows with that key as the
  provider's idempotency key; :meth:`Outbox.reconcile` compares both sides.
* :class:`ETagStore`: conditional replacement by an opaque version string. It
  rejects a stale version, but ETags are not ordered and say nothing about who
  may write.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from labkit.clock import Clock, check_clock, read_clock
from labkit.db import check_name, ensure_schema, execute, rowcount, transaction
from labkit.errors import BadArgument, BadArgumentType, KeyReused
from labkit.fence import Fence, Tx, check_tx, show, token
from labkit.idempotency import canonical
from labkit.errors import check_number, MAX_INT

__all__ = [
    "FencedFileStore",
    "EmailProvider",
    "PaymentProvider",
    "Delivery",
    "Outbox",
    "Reconciliation",
    "ETagStore",
]


def _bytes(data, argument: str = "data") -> bytes:
    if not isinstance(data, (bytes, bytearray)):
        raise BadArgumentType(argument, f"must be bytes, got {type(data).__name__}")
    return bytes(data)


class FencedFileStore:
    """Files under ``directory`` whose current version is decided by a fenced transaction.

    A write first stores the bytes as an immutable content-addressed blob
    (``blobs/<sha256>``, via a temp file and an atomic rename), then, inside
    ``fence.guard(generation)``, points the ``files`` row at it. The commit is
    the only moment a file changes, so the fence check and the write are one
    atomic step; a stale write leaves at most an unreferenced blob.

    Example:
        >>> import tempfile; from labkit import connect
        >>> store = FencedFileStore(connect(), tempfile.mkdtemp(), "invoice-run")
        >>> _ = store.write("report.txt", b"run 8", 8)
        >>> store.read("report.txt"), store.generation("report.txt")
        (b'run 8', 8)
    """

    def __init__(self, db, directory, job: str) -> None:
        if not isinstance(directory, (str, os.PathLike)):
            raise BadArgumentType("directory", f"must be a path, got {type(directory).__name__}")
        self.directory = Path(check_name(os.fspath(directory), "directory"))
        self.db, self.fence = db, Fence(db, job)
        (self.directory / "blobs").mkdir(parents=True, exist_ok=True)
        ensure_schema(
            db,
            "files",
            """CREATE TABLE files (
            name TEXT PRIMARY KEY, epoch INTEGER NOT NULL, generation INTEGER NOT NULL,
            blob TEXT NOT NULL, size INTEGER NOT NULL)""",
        )

    def _stage(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        final = self.directory / "blobs" / digest
        if not final.exists():
            handle, temp = tempfile.mkstemp(dir=final.parent, suffix=".tmp")
            with os.fdopen(handle, "wb") as out:
                out.write(data)
            os.replace(temp, final)
        return digest

    def write(self, name: str, data: bytes, generation, *, tx: Tx | None = None) -> str:
        """Replace file ``name`` with ``data`` if ``generation`` passes the fence; return the blob id.

        With ``tx`` (from ``fence.guard(generation)`` of this store's job, on this
        store's connection), the write joins that transaction, so it commits
        together with the block's other writes.

        Raises:
            StaleGeneration: the fence is above ``generation``; the file is unchanged.
            BadArgument: ``tx`` was opened with another generation, by another
                job's fence, on another connection, without a fence (e.g. the
                ``tx`` of ``run_once(db, ...)``), or its block has ended.
        """
        name, data, offered = check_name(name, "name"), _bytes(data), token(generation)
        if tx is not None:
            check_tx(tx, self.db, self.fence.job)
            if tuple(tx.token) != offered:
                raise BadArgument("tx", f"was opened with {show(tx.token)}, not {show(offered)}")
            return self._commit(tx, name, data)
        with self.fence.guard(offered) as tx:
            return self._commit(tx, name, data)

    def _commit(self, tx: Tx, name: str, data: bytes) -> str:
        blob = self._stage(data)
        tx.execute(
            """INSERT INTO files(name, epoch, generation, blob, size) VALUES (?, ?, ?, ?, ?)
                      ON CONFLICT(name) DO UPDATE SET epoch = excluded.epoch,
                          generation = excluded.generation, blob = excluded.blob, size = excluded.size""",
            (name, *tx.token, blob, len(data)),
        )
        return blob

    def read(self, name: str) -> bytes | None:
        """The current content of ``name``, or None if it was never written."""
        path = self.path(name)
        return None if path is None else path.read_bytes()

    def path(self, name: str) -> Path | None:
        """The on-disk path of the current content of ``name`` (a blob), or None."""
        rows = execute(
            self.db, "SELECT blob FROM files WHERE name = ?", (check_name(name, "name"),)
        )
        return self.directory / "blobs" / rows[0][0] if rows else None

    def generation(self, name: str) -> int | tuple[int, int] | None:
        """The token that wrote the current content of ``name``, or None."""
        rows = execute(
            self.db,
            "SELECT epoch, generation FROM files WHERE name = ?",
            (check_name(name, "name"),),
        )
        return show(rows[0]) if rows else None

    def __repr__(self) -> str:
        return f"FencedFileStore(directory={str(self.directory)!r}, job={self.fence.job!r})"


@dataclass(frozen=True, slots=True)
class Delivery:
    """What a provider answered.

    Attributes:
        id: the provider's id for the email or charge.
        replayed: True if the idempotency key was known and nothing new happened.
    """

    id: int
    replayed: bool


class _Provider:
    """An external service that keeps its own records (own database) by idempotency key."""

    kind = "effect"

    def __init__(self, db, clock: Clock, *, key_ttl: float | None = None) -> None:
        self.db, self.clock = db, check_clock(clock)
        self.key_ttl = None if key_ttl is None else check_number(key_ttl, "key_ttl", positive=True)
        ensure_schema(
            db,
            "provider_records",
            """CREATE TABLE provider_records (
            id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, idempotency_key TEXT,
            payload TEXT NOT NULL, created_at REAL NOT NULL)""",
        )
        ensure_schema(
            db,
            "provider_keys",
            """CREATE TABLE provider_keys (
            kind TEXT NOT NULL, key TEXT NOT NULL, record INTEGER NOT NULL,
            created_at REAL NOT NULL, PRIMARY KEY (kind, key))""",
        )

    def deliver(self, payload: dict, *, idempotency_key: str | None = None) -> Delivery:
        """Carry out the effect once per key (while the key is remembered); no key: every time.

        With a key, one ``INSERT ... ON CONFLICT DO NOTHING`` into the key table
        decides: a row inserted means this call is the first (the record follows
        in the same transaction); none means the key is known, and the stored
        record is replayed.

        Raises:
            KeyReused: the key is known with a different payload. Nothing happened.
        """
        offered = canonical(payload, "payload")
        key = None if idempotency_key is None else check_name(idempotency_key, "idempotency_key")
        now = read_clock(self.clock)
        with transaction(self.db):
            if key is not None:
                if self.key_ttl is not None:  # the provider forgets keys after key_ttl
                    execute(
                        self.db,
                        "DELETE FROM provider_keys WHERE kind = ? AND key = ? "
                        "AND created_at + ? <= ?",
                        (self.kind, key, self.key_ttl, now),
                    )
                first = rowcount(
                    self.db,
                    "INSERT INTO provider_keys(kind, key, record, created_at) "
                    "VALUES (?, ?, 0, ?) ON CONFLICT(kind, key) DO NOTHING",
                    (self.kind, key, now),
                )
                if not first:
                    [(known, stored)] = execute(
                        self.db,
                        """
                        SELECT r.id, r.payload FROM provider_keys k JOIN provider_records r ON r.id = k.record
                        WHERE k.kind = ? AND k.key = ?""",
                        (self.kind, key),
                    )
                    if stored != offered:
                        raise KeyReused(key, stored, offered)
                    return Delivery(known, True)
            record = execute(
                self.db,
                "INSERT INTO provider_records(kind, idempotency_key, payload, "
                "created_at) VALUES (?, ?, ?, ?) RETURNING id",
                (self.kind, key, offered, now),
            )[0][0]
            if key is not None:
                execute(
                    self.db,
                    "UPDATE provider_keys SET record = ? WHERE kind = ? AND key = ?",
                    (record, self.kind, key),
                )
        return Delivery(record, False)

    def records(self) -> list[dict]:
        """Everything this provider did, oldest first: id, idempotency_key, payload, created_at."""
        rows = execute(
            self.db,
            "SELECT id, idempotency_key, payload, created_at FROM provider_records "
            "WHERE kind = ? ORDER BY id",
            (self.kind,),
        )
        return [
            {"id": i, "idempotency_key": k, "payload": json.loads(p), "created_at": t}
            for i, k, p, t in rows
        ]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(records={len(self.records())})"


class EmailProvider(_Provider):
    """A fake email service: one email per idempotency key, but blind to generations.

    Example:
        >>> from labkit import connect, VirtualClock
        >>> mail = EmailProvider(connect(), VirtualClock())
        >>> a = mail.send("ops@example.com", "run 8", "done", idempotency_key="run-8")
        >>> b = mail.send("ops@example.com", "run 8", "done", idempotency_key="run-8")
        >>> (a.id == b.id, b.replayed, len(mail.records()))
        (True, True, 1)
    """

    kind = "email"

    def send(
        self, to: str, subject: str, body: str, *, idempotency_key: str | None = None
    ) -> Delivery:
        """Send one email (or, for a known key with the same content, nothing)."""
        return self.deliver(
            {"to": check_name(to, "to"), "subject": subject, "body": body},
            idempotency_key=idempotency_key,
        )


class PaymentProvider(_Provider):
    """A fake payment service with an idempotency contract: a key is remembered for ``key_ttl`` s.

    Within that window a retried charge with the same key and amount returns
    the first charge; after it, the same key charges again (read the contract).

    Example:
        >>> from labkit import connect, VirtualClock
        >>> clock = VirtualClock(); pay = PaymentProvider(connect(), clock, key_ttl=86400)
        >>> pay.charge("acct-1", 120, idempotency_key="inv-1").replayed, \\
        ...     pay.charge("acct-1", 120, idempotency_key="inv-1").replayed
        (False, True)
    """

    kind = "charge"

    def charge(self, account: str, amount: int, *, idempotency_key: str | None = None) -> Delivery:
        """Charge ``amount`` to ``account`` once per key (while the key is remembered).

        Raises:
            BadArgumentType: ``amount`` is not an int (cents). BadArgument: it is not positive.
        """
        if check_number(amount, "amount", integer=True, high=MAX_INT) == 0:
            raise BadArgument("amount", "must be a positive int (cents), got 0")
        return self.deliver(
            {"account": check_name(account, "account"), "amount": amount},
            idempotency_key=idempotency_key,
        )


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """What comparing the outbox with the provider found.

    Attributes:
        confirmed: keys delivered but not yet marked sent (now marked).
        missing: keys marked sent that the provider has no record of.
        unknown: provider records with no outbox row (sent around the outbox), as record ids.
    """

    confirmed: tuple
    missing: tuple
    unknown: tuple


class Outbox:
    """Effect intents written inside the fenced transaction, delivered later by a relay.

    Args:
        db: the database the intents live in (the fenced transactions' database).
        clock: where "now" comes from.
        job: if given, :meth:`add` accepts only transactions this job's fence
            accepted; otherwise any fenced transaction on ``db``.

    Example:
        >>> from labkit import connect, VirtualClock, Fence
        >>> db, clock = connect(), VirtualClock()
        >>> box, mail = Outbox(db, clock), EmailProvider(connect(), clock)
        >>> with Fence(db, "run").guard(8) as tx:
        ...     box.add(tx, "run/report-email", "email", {"to": "ops", "subject": "s", "body": "b"})
        True
        >>> box.relay(mail), box.relay(mail), len(mail.records())
        (['run/report-email'], [], 1)
    """

    def __init__(self, db, clock: Clock, *, job: str | None = None) -> None:
        self.db, self.clock = db, check_clock(clock)
        self.job = None if job is None else check_name(job, "job")
        ensure_schema(
            db,
            "outbox",
            """CREATE TABLE outbox (
            key TEXT PRIMARY KEY, kind TEXT NOT NULL, payload TEXT NOT NULL,
            epoch INTEGER NOT NULL, generation INTEGER NOT NULL,
            state TEXT NOT NULL CHECK (state IN ('pending', 'sent')),
            provider_id INTEGER, created_at REAL NOT NULL, sent_at REAL)""",
        )

    def add(self, tx: Tx, key: str, kind: str, payload: dict) -> bool:
        """Record the intent in the open fenced transaction ``tx``; False if ``key`` exists already.

        The row carries ``tx.token``, the token the fence accepted in that transaction.

        Raises:
            BadArgumentType: ``tx`` is not a :class:`~labkit.Tx`.
            BadArgument: ``tx`` is not fenced (e.g. the ``tx`` of ``run_once(db, ...)``),
                its block has ended, it runs on another connection, or (for an
                outbox made with ``job``) another job's fence accepted it.
        """
        check_tx(tx, self.db, self.job)
        rows = tx.execute(
            "INSERT INTO outbox(key, kind, payload, epoch, generation, state, created_at) "
            "VALUES (?, ?, ?, ?, ?, 'pending', ?) ON CONFLICT(key) DO NOTHING RETURNING key",
            (
                check_name(key, "key"),
                check_name(kind, "kind"),
                canonical(payload, "payload"),
                *tx.token,
                read_clock(self.clock),
            ),
        )
        return bool(rows)

    def pending(self, kind: str | None = None) -> list[tuple[str, str, dict, int]]:
        """Pending rows (of ``kind``, if given), oldest first, as ``(key, kind, payload, generation)``."""
        if kind is not None:
            check_name(kind, "kind")
        rows = execute(
            self.db,
            "SELECT key, kind, payload, generation FROM outbox WHERE state = 'pending' "
            "AND (? IS NULL OR kind = ?) ORDER BY created_at, key",
            (kind, kind),
        )
        return [(k, kd, json.loads(p), g) for k, kd, p, g in rows]

    def send(self, key: str, payload: dict, provider: _Provider) -> Delivery:
        """Deliver one row through ``provider`` with the row's key as the idempotency key."""
        return provider.deliver(payload, idempotency_key=key)

    def mark_sent(self, key: str, provider_id: int) -> bool:
        """Mark ``key`` sent (one conditional UPDATE on a pending row); False if it was not pending."""
        key, provider_id = (
            check_name(key, "key"),
            check_number(provider_id, "provider_id", integer=True, high=MAX_INT),
        )
        now = read_clock(self.clock)
        with transaction(self.db):
            return bool(
                execute(
                    self.db,
                    "UPDATE outbox SET state = 'sent', provider_id = ?, sent_at = ? "
                    "WHERE key = ? AND state = 'pending' RETURNING key",
                    (provider_id, now, key),
                )
            )

    def relay(self, provider: _Provider) -> list[str]:
        """Send every pending row of ``provider.kind`` and mark it; return the keys marked now.

        A crash between sending and marking leaves the row pending; the next
        relay sends it again with the same key and the provider replays it.
        """
        done = []
        for key, _kind, payload, _generation in self.pending(provider.kind):
            if self.mark_sent(key, self.send(key, payload, provider).id):
                done.append(key)
        return done

    def reconcile(self, provider: _Provider) -> Reconciliation:
        """Compare the outbox with ``provider``'s records; mark rows the provider already delivered."""
        records = provider.records()
        theirs = {r["idempotency_key"]: r["id"] for r in records}
        ours = dict(
            execute(self.db, "SELECT key, state FROM outbox WHERE kind = ?", (provider.kind,))
        )
        confirmed = tuple(
            k
            for k, s in sorted(ours.items())
            if s == "pending" and k in theirs and self.mark_sent(k, theirs[k])
        )
        missing = tuple(k for k, s in sorted(ours.items()) if s == "sent" and k not in theirs)
        unknown = tuple(r["id"] for r in records if r["idempotency_key"] not in ours)
        return Reconciliation(confirmed, missing, unknown)

    def __repr__(self) -> str:
        return f"Outbox(pending={len(self.pending())})"


class ETagStore:
    """Objects replaced by compare-and-set on an opaque ETag (a hash of the content).

    :meth:`replace` succeeds only if the caller's ETag is the current one, so
    a writer holding an out-of-date version is rejected. Two limits: an ETag is
    not ordered (content that comes back makes an old ETag current again, and
    nobody can tell which of two ETags is newer), and it is not an
    authorization check (anyone who reads the object may replace it).

    Example:
        >>> from labkit import connect
        >>> store = ETagStore(connect())
        >>> v1 = store.put("report", b"run 7"); v2 = store.replace("report", b"run 8", if_match=v1)
        >>> store.replace("report", b"stale", if_match=v1) is None
        True
    """

    def __init__(self, db) -> None:
        self.db = db
        ensure_schema(
            db,
            "objects",
            "CREATE TABLE objects (name TEXT PRIMARY KEY, etag TEXT NOT NULL, body BLOB NOT NULL)",
        )

    @staticmethod
    def etag(body: bytes) -> str:
        """The ETag of ``body``: the first 16 hex digits of its SHA-256."""
        return hashlib.sha256(_bytes(body, "body")).hexdigest()[:16]

    def get(self, name: str) -> tuple[bytes, str] | None:
        """``(body, etag)`` of ``name``, or None."""
        rows = execute(
            self.db, "SELECT body, etag FROM objects WHERE name = ?", (check_name(name, "name"),)
        )
        return (bytes(rows[0][0]), rows[0][1]) if rows else None

    def put(self, name: str, body: bytes) -> str:
        """Write ``name`` unconditionally; return its new ETag."""
        etag, name = self.etag(body), check_name(name, "name")
        with transaction(self.db):
            execute(
                self.db,
                "INSERT INTO objects VALUES (?, ?, ?) ON CONFLICT(name) DO UPDATE "
                "SET etag = excluded.etag, body = excluded.body",
                (name, etag, bytes(body)),
            )
        return etag

    def replace(self, name: str, body: bytes, *, if_match: str) -> str | None:
        """Replace ``name`` only if its ETag is ``if_match``; return the new ETag, or None (412)."""
        etag, name = self.etag(body), check_name(name, "name")
        with transaction(self.db):
            rows = execute(
                self.db,
                "UPDATE objects SET etag = ?, body = ? WHERE name = ? AND etag = ? RETURNING etag",
                (etag, bytes(body), name, check_name(if_match, "if_match")),
            )
        return rows[0][0] if rows else None

    def __repr__(self) -> str:
        return "ETagStore()"
