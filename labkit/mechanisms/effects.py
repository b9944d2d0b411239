"""Effects outside the database: a file that can be fenced, an email and a payment that cannot.

The providers are fake services (own SQLite file) that honour idempotency keys but know
nothing of generations; :class:`Outbox` records an intent inside the fenced transaction
and relays it later under its key. :class:`ETagStore` shows why a version check is no fence."""

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from labkit.clock import Clock, check_clock, read_clock
from labkit.db import check_name, ensure_schema, execute, rowcount, transaction
from labkit.errors import MAX_INT, BadArgument, BadArgumentType, KeyReused, check_number
from labkit.fence import Fence, Tx, check_tx, show, token
from labkit.idempotency import canonical

__all__ = ["FencedFileStore", "EmailProvider", "PaymentProvider", "Delivery", "Outbox", "ETagStore"]

_SCHEMA = {
    "files": """CREATE TABLE files (name TEXT PRIMARY KEY, epoch INTEGER NOT NULL,
        generation INTEGER NOT NULL, blob TEXT NOT NULL, size INTEGER NOT NULL)""",
    "provider_records": """CREATE TABLE provider_records (id INTEGER PRIMARY KEY AUTOINCREMENT,
        kind TEXT NOT NULL, idempotency_key TEXT, payload TEXT NOT NULL,
        created_at REAL NOT NULL)""",
    "provider_keys": """CREATE TABLE provider_keys (kind TEXT NOT NULL, key TEXT NOT NULL,
        created_at REAL NOT NULL, PRIMARY KEY (kind, key))""",
    "outbox": """CREATE TABLE outbox (key TEXT PRIMARY KEY, kind TEXT NOT NULL,
        payload TEXT NOT NULL, epoch INTEGER NOT NULL, generation INTEGER NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('pending', 'sent')),
        provider_id INTEGER, created_at REAL NOT NULL, sent_at REAL)""",
    "objects": """CREATE TABLE objects (name TEXT PRIMARY KEY, etag TEXT NOT NULL,
        body BLOB NOT NULL)""",
}


_CLAIM_KEY = """INSERT INTO provider_keys VALUES (:kind, :key, :now)
    ON CONFLICT(kind, key) DO UPDATE SET created_at = :now WHERE created_at + :ttl <= :now"""
_KNOWN = """SELECT id, payload FROM provider_records WHERE kind = :kind AND idempotency_key = :key
    ORDER BY id DESC LIMIT 1"""
_RECORD = """INSERT INTO provider_records(kind, idempotency_key, payload, created_at)
    VALUES (:kind, :key, :payload, :now) RETURNING id"""


def _ensure(db, *tables: str) -> None:
    for table in tables:
        ensure_schema(db, table, _SCHEMA[table])


def _bytes(data, argument: str) -> bytes:
    if not isinstance(data, (bytes, bytearray)):
        raise BadArgumentType(argument, f"must be bytes, got {type(data).__name__}")
    return bytes(data)


class FencedFileStore:
    """Files under ``directory`` whose current version is decided by a fenced transaction.

    A write stores the bytes as a blob ``blobs/<sha256>`` (temp file, atomic rename), then
    points the ``files`` row at it inside the guard: a stale write leaves only a stray blob.

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
        _ensure(db, "files")

    def write(self, name: str, data: bytes, generation, *, tx: Tx | None = None) -> str:
        """Replace file ``name`` by ``data`` if ``generation`` passes the fence; return the blob id.
        With ``tx`` (a live guard of this store's job at ``generation``) the write joins it."""
        name, data, offered = check_name(name, "name"), _bytes(data, "data"), token(generation)
        if tx is None:
            with self.fence.guard(offered) as guarded:
                return self._commit(guarded, name, data)
        check_tx(tx, self.db, self.fence.job)
        if tuple(tx.token) != offered:
            raise BadArgument("tx", f"was opened with {show(tx.token)}, not {show(offered)}")
        return self._commit(tx, name, data)

    def _commit(self, tx: Tx, name: str, data: bytes) -> str:
        blob = hashlib.sha256(data).hexdigest()
        final = self.directory / "blobs" / blob
        if not final.exists():
            handle, temp = tempfile.mkstemp(dir=final.parent, suffix=".tmp")
            with os.fdopen(handle, "wb") as out:
                out.write(data)
            os.replace(temp, final)
        sql = "INSERT OR REPLACE INTO files VALUES ($1, $2, $3, $4, $5)"  # in the order of _SCHEMA
        tx.execute(sql, (name, *tx.token, blob, len(data)))
        return blob

    def read(self, name: str) -> bytes | None:
        """The current content of ``name``, or None if it was never written."""
        path = self.path(name)
        return None if path is None else path.read_bytes()

    def path(self, name: str) -> Path | None:
        """The on-disk path of the current content of ``name`` (a blob), or None."""
        name = check_name(name, "name")
        rows = execute(self.db, "SELECT blob FROM files WHERE name = $1", (name,))
        return self.directory / "blobs" / rows[0][0] if rows else None

    def generation(self, name: str) -> int | tuple[int, int] | None:
        """The token that wrote the current content of ``name``, or None."""
        name = check_name(name, "name")
        rows = execute(self.db, "SELECT epoch, generation FROM files WHERE name = $1", (name,))
        return show(rows[0]) if rows else None


@dataclass(frozen=True, slots=True)
class Delivery:
    """What a provider answered: its ``id`` for the email or charge, and ``replayed``
    (True if the key was known and nothing new happened)."""

    id: int
    replayed: bool


class _Provider:
    """An external service that keeps its own records (own database) by idempotency key."""

    kind = "effect"

    def __init__(self, db, clock: Clock, *, key_ttl: float | None = None) -> None:
        self.db, self.clock = db, check_clock(clock)
        self.key_ttl = None if key_ttl is None else check_number(key_ttl, "key_ttl", positive=True)
        _ensure(db, "provider_records", "provider_keys")

    def deliver(self, payload: dict, *, idempotency_key: str | None = None) -> Delivery:
        """Carry out the effect once per remembered key (KeyReused for another payload)."""
        offered = canonical(payload, "payload")
        key = None if idempotency_key is None else check_name(idempotency_key, "idempotency_key")
        where = {"kind": self.kind, "key": key, "now": read_clock(self.clock), "ttl": self.key_ttl}
        with transaction(self.db):
            # one conditional write claims a new key, or one forgotten after key_ttl
            if key is not None and not rowcount(self.db, _CLAIM_KEY, where):
                [(known, stored)] = execute(self.db, _KNOWN, where)
                if stored != offered:
                    raise KeyReused(key, stored, offered)
                return Delivery(known, True)
            [(record,)] = execute(self.db, _RECORD, {**where, "payload": offered})
        return Delivery(record, False)

    def records(self) -> list[dict]:
        """Everything this provider did, oldest first: id, idempotency_key, payload, created_at."""
        sql = """SELECT id, idempotency_key, payload, created_at FROM provider_records
            WHERE kind = $1 ORDER BY id"""
        rows = execute(self.db, sql, (self.kind,))
        return [
            {"id": i, "idempotency_key": k, "payload": json.loads(p), "created_at": t}
            for i, k, p, t in rows
        ]


class EmailProvider(_Provider):
    """A fake email service: one email per idempotency key, but blind to generations."""

    kind = "email"

    def send(
        self, to: str, subject: str, body: str, *, idempotency_key: str | None = None
    ) -> Delivery:
        """Send one email (or, for a known key with the same content, nothing)."""
        payload = {"to": check_name(to, "to"), "subject": subject, "body": body}
        return self.deliver(payload, idempotency_key=idempotency_key)


class PaymentProvider(_Provider):
    """A fake payment service whose contract remembers a key for ``key_ttl`` seconds only."""

    kind = "charge"

    def charge(self, account: str, amount: int, *, idempotency_key: str | None = None) -> Delivery:
        """Charge ``amount`` cents (an int > 0) to ``account`` once per key while it is kept."""
        amount = check_number(amount, "amount", integer=True, positive=True, high=MAX_INT)
        payload = {"account": check_name(account, "account"), "amount": amount}
        return self.deliver(payload, idempotency_key=idempotency_key)


class Outbox:
    """Intents written in a fenced transaction (of ``job``'s fence, if given), relayed later."""

    def __init__(self, db, clock: Clock, *, job: str | None = None) -> None:
        self.db, self.clock = db, check_clock(clock)
        self.job = None if job is None else check_name(job, "job")
        _ensure(db, "outbox")

    def add(self, tx: Tx, key: str, kind: str, payload: dict) -> bool:
        """Record the intent with its token in the fenced ``tx``; False if ``key`` exists."""
        if check_tx(tx, self.db, self.job).job is None:
            raise BadArgument("tx", "is not fenced: open it with Fence(db, job).guard(token)")
        row = (check_name(key, "key"), check_name(kind, "kind"), canonical(payload, "payload"))
        sql = """INSERT INTO outbox(key, kind, payload, epoch, generation, state, created_at)
            VALUES ($1, $2, $3, $4, $5, 'pending', $6) ON CONFLICT(key) DO NOTHING RETURNING key"""
        return bool(tx.execute(sql, (*row, *tx.token, read_clock(self.clock))))

    def pending(self, kind: str | None = None) -> list[tuple[str, str, dict, int]]:
        """Pending rows (of ``kind``), oldest first, as ``(key, kind, payload, generation)``."""
        kind = None if kind is None else check_name(kind, "kind")
        sql = """SELECT key, kind, payload, generation FROM outbox WHERE state = 'pending'
            AND ($1 IS NULL OR kind = $2) ORDER BY created_at, key"""
        rows = execute(self.db, sql, (kind, kind))
        return [(k, kd, json.loads(p), g) for k, kd, p, g in rows]

    def mark_sent(self, key: str, provider_id: int) -> bool:
        """Mark ``key`` sent by one conditional UPDATE; False if it was not pending."""
        key = check_name(key, "key")
        provider_id = check_number(provider_id, "provider_id", integer=True, high=MAX_INT)
        sql = """UPDATE outbox SET state = 'sent', provider_id = $1, sent_at = $2
            WHERE key = $3 AND state = 'pending'"""
        row = (provider_id, read_clock(self.clock), key)
        with transaction(self.db):
            return rowcount(self.db, sql, row) == 1

    def relay(self, provider: _Provider) -> list[str]:
        """Deliver each pending row of ``provider.kind`` under its key, mark it; return keys marked.
        After a crash between the two, the next relay delivers again and the provider replays."""
        done = []
        for key, _kind, payload, _generation in self.pending(provider.kind):
            if self.mark_sent(key, provider.deliver(payload, idempotency_key=key).id):
                done.append(key)
        return done

    def reconcile(self, provider: _Provider) -> dict[str, tuple]:
        """Mark what ``provider``'s records show delivered; return ``{"confirmed": keys now
        marked, "missing": sent keys it lacks, "unknown": ids sent around the outbox}``."""
        records = provider.records()
        theirs = {r["idempotency_key"]: r["id"] for r in records}
        query = "SELECT key, state FROM outbox WHERE kind = $1 ORDER BY key"
        ours = dict(execute(self.db, query, (provider.kind,)))
        delivered = [k for k, state in ours.items() if state == "pending" and k in theirs]
        return {
            "confirmed": tuple(k for k in delivered if self.mark_sent(k, theirs[k])),
            "missing": tuple(k for k, s in ours.items() if s == "sent" and k not in theirs),
            "unknown": tuple(r["id"] for r in records if r["idempotency_key"] not in ours),
        }


class ETagStore:
    """Objects replaced by compare-and-set on an ETag, an opaque validator of the current object.

    The store promises only that the ETag changes when the object does. ``etags="hash"`` (the
    default) makes it a hash of the content, as some stores do; ``etags="version"`` a value
    drawn from the object's history, which never comes back. Neither kind is a right to write:
    any worker can read the object and present its current ETag. A content hash is also not
    ordered: old content brings its old ETag back (ABA)."""

    def __init__(self, db, *, etags: str = "hash") -> None:
        if etags not in ("hash", "version"):
            raise BadArgument("etags", f"must be 'hash' or 'version', got {etags!r}")
        self.db, self.etags = db, etags
        _ensure(db, "objects")

    def get(self, name: str) -> tuple[bytes, str] | None:
        """``(body, etag)`` of ``name``, or None."""
        name = check_name(name, "name")
        rows = execute(self.db, "SELECT body, etag FROM objects WHERE name = $1", (name,))
        return (bytes(rows[0][0]), rows[0][1]) if rows else None

    def put(self, name: str, body: bytes) -> str:
        """Write ``name`` unconditionally; return its new ETag."""
        sql = "INSERT OR REPLACE INTO objects VALUES (:name, :etag, :body)"
        return self._write(sql, name, body)

    def replace(self, name: str, body: bytes, *, if_match: str) -> str | None:
        """Replace ``name`` only if its ETag is ``if_match``; return the new ETag, or None (412)."""
        sql = "UPDATE objects SET etag = :etag, body = :body WHERE name = :name AND etag = :match"
        return self._write(sql, name, body, match=check_name(if_match, "if_match"))

    def _write(self, sql: str, name: str, body: bytes, **params) -> str | None:
        body, name = _bytes(body, "body"), check_name(name, "name")
        with transaction(self.db):
            seen = execute(self.db, "SELECT etag FROM objects WHERE name = $1", (name,))
            mark = (
                body if self.etags == "hash" else f"{seen[0][0] if seen else ''}/".encode() + body
            )
            etag = hashlib.sha256(mark).hexdigest()[:16]  # "version": chained, so never repeated
            changed = rowcount(self.db, sql, {**params, "name": name, "etag": etag, "body": body})
        return etag if changed else None
