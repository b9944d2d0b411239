"""The one codec and request loop that the judge and the sandboxed worker share.

Messages are JSON objects, one per line, over a pair of file descriptors
(:class:`~labkit.grading.channel.Channel`). Values cross as the plain types of :func:`encode`;
every other object stays where it lives and the other side gets a :class:`Remote` of it, whose
uses are requests (:class:`Peer`). This module imports nothing of ``labkit.grading`` but
``channel``, which sits beside it: the sandbox sees both and no check. Hand-written because the
message set is a handful of operations over a pipe; an RPC library would be one more dependency
for the sandbox to carry, and none lets a request nest inside another's reply.
"""

from __future__ import annotations

import base64
import dataclasses
import importlib
import random
import sys

if __package__:
    from labkit.grading.channel import LIMIT, Channel, ChannelClosed
else:  # in the sandbox, beside channel.py
    from channel import LIMIT, Channel, ChannelClosed

#: True in the sandboxed worker: classes may be imported; the judge only uses what it loaded
SANDBOX = False

#: rng types that cross as the seed of a ``random.Random`` built over there, each with the function
#: that hands one over (the judge's ``labkit.grading.lab.Fresh``)
COPIED: dict = {}


class NotCrossable(TypeError):
    """A value of a type that cannot cross the boundary (``kind`` names it)."""


def _allowed(module: str) -> bool:
    labkit = module.startswith("labkit.") and not module.startswith("labkit.grading")
    return module in ("builtins", "sqlite3") or labkit


def encode(value, handle):
    """``value`` as JSON: exact None/bool/int/float/str, tagged lists ``["L", ...]``, tuples
    ``["T", ...]``, dicts ``["D", pairs]``, bytes ``["B", b64]``, labkit frozen dataclasses
    ``["E", module, name, fields]`` (rebuilt field by field, ``__post_init__`` skipped: a
    ``Tx`` keeps its connection), an rng of a type in :data:`COPIED` ``["R", seed]``; anything
    else becomes ``handle(value)``."""
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return value
    if kind in (list, tuple):
        return ["L" if kind is list else "T", [encode(v, handle) for v in value]]
    if kind is dict:
        return ["D", [[encode(k, handle), encode(v, handle)] for k, v in value.items()]]
    if kind is bytes:
        return ["B", base64.b64encode(value).decode()]
    if kind in COPIED:
        return ["R", COPIED[kind](value)]
    params = getattr(kind, "__dataclass_params__", None)
    if params is not None and params.frozen and _allowed(kind.__module__):
        fields = {f.name: encode(getattr(value, f.name), handle) for f in dataclasses.fields(value)}
        return ["E", kind.__module__, kind.__qualname__, fields]
    return handle(value)


def decode(data, resolve):
    """The inverse of :func:`encode`; ``resolve(tagged)`` turns an ``["H", ...]`` into an object."""
    if not isinstance(data, list):
        return data
    tag, body = data[0], data[1] if len(data) > 1 else None
    if tag in ("L", "T"):
        items = [decode(v, resolve) for v in body]
        return items if tag == "L" else tuple(items)
    if tag == "D":
        return {decode(k, resolve): decode(v, resolve) for k, v in body}
    if tag == "B":
        return base64.b64decode(body)
    if tag == "R" and type(body) is int:
        return random.Random(body)
    if tag == "E":  # field by field, as it was on the other side (a Tx keeps its connection)
        cls = find_class(data[1], data[2])
        if not isinstance(cls, type) or not dataclasses.is_dataclass(cls):
            raise NotCrossable(f"{data[1]}.{data[2]} is not a labkit value")
        names = [f.name for f in dataclasses.fields(cls)]
        if not isinstance(data[3], dict) or sorted(data[3]) != sorted(names):
            raise NotCrossable(f"{data[2]} with the fields {sorted(data[3])}")
        value = cls.__new__(cls)
        for name in names:
            object.__setattr__(value, name, decode(data[3][name], resolve))
        return value
    if tag in ("H", "Y"):
        return resolve(data)
    raise NotCrossable(f"unknown tag {tag!r}")


def find_class(module: str, name: str):
    """The class ``module.name`` if the module is allowed and loaded (the worker may import it;
    the judge only looks among what it has already imported), else None."""
    if not isinstance(module, str) or not isinstance(name, str) or not _allowed(module):
        return None
    try:
        loaded = importlib.import_module(module) if SANDBOX else sys.modules.get(module)
    except ImportError:
        return None
    return getattr(loaded, name, None)


def describe(exc: BaseException, origin=None) -> dict:
    """An exception as a message: its class chain, its text, and (judge side) its origin id."""
    chain = [[c.__module__, c.__qualname__] for c in type(exc).__mro__]
    return {"chain": chain, "text": str(exc), "origin": getattr(exc, "_labkit_origin", origin)}


def rebuild(info: dict, *, keep_name: bool) -> BaseException:
    """An exception like ``info``'s, of its first class known here (``keep_name``: a stand-in
    subclass of that with the original name, so the answer's ``except`` sees what it would)."""
    chain = [c for c in info.get("chain", []) if isinstance(c, list) and len(c) == 2]
    cls = None
    for module, name in chain:
        found = find_class(module, name)
        if isinstance(found, type) and issubclass(found, BaseException):
            cls = found
            break
    cls = cls or Exception
    if keep_name and chain and chain[0][1] != cls.__qualname__:
        cls = type(str(chain[0][1]), (cls,), {"__module__": "labkit-judge"})
    exc = cls.__new__(cls)
    BaseException.__init__(exc, str(info.get("text", "")))
    exc._labkit_origin = info.get("origin")
    return exc


# ------------------------------------------------------------------ both sides


class Peer:
    """One end of the channel: the objects it lent the other side (``mine``), the proxies it
    holds of the other's (``theirs``), and the request loop. A request is served while waiting
    for a reply, so calls nest both ways (a trial's callback calls the answer again, say)."""

    def __init__(self, channel: Channel) -> None:
        self.channel, self.mine, self.theirs, self.ids = channel, {}, {}, {}
        self.raised = {}  # id -> an exception of ours the other side saw

    def handle(self, value):
        """``["Y", id]`` for the other side's own object coming back, else ``["H", id, kind]``."""
        ident = self.ids.get(id(value))
        if ident is not None and self.theirs.get(ident) is value:
            return ["Y", ident]
        self.mine[id(value)] = value
        return ["H", id(value), *self.kind(value)]

    def kind(self, value) -> list:
        return ["object"]

    def resolve(self, tagged):
        if tagged[0] == "Y":
            if tagged[1] not in self.mine:
                raise NotCrossable("a handle never given out")
            return self.mine[tagged[1]]
        ident = tagged[1]
        if ident not in self.theirs:
            self.theirs[ident] = self.proxy(tagged)
            self.ids[id(self.theirs[ident])] = ident
        return self.theirs[ident]

    def proxy(self, tagged):
        return Remote(self, tagged[1])

    def out(self, value):
        return encode(value, self.handle)

    def into(self, data):
        return decode(data, self.resolve)

    def request(self, ident, what: str, *args, raw: bool = False):
        """Ask the other side to do ``what`` to its object ``ident``, serving it meanwhile
        (``raw``: return the reply's value undecoded)."""
        self.send({"op": "req", "id": ident, "what": what, "args": self.out(list(args))})
        while True:
            message = self.wait()
            if message["op"] == "reply":
                return message["value"] if raw else self.into(message["value"])
            if message["op"] == "error":
                raise self.rebuild(message["exc"])
            if message["op"] == "req":
                self.serve(message)
            else:
                self.unexpected(message)

    def wait(self) -> dict:
        return self.channel.recv()

    def send(self, message: dict) -> None:
        self.channel.send(message)

    def unexpected(self, message: dict) -> None:
        raise ChannelClosed(f"unexpected {message.get('op')!r}")

    def rebuild(self, info: dict) -> BaseException:
        if info.get("origin") in self.raised:  # our own exception, come back unchanged
            return self.raised[info["origin"]]
        return rebuild(info, keep_name=SANDBOX)

    def allow(self, target, what: str, args: list) -> None:
        """Raise if the other side may not do ``what`` to ``target`` (the judge's rule)."""

    def perform(self, target, what: str, args: list):
        return perform(target, what, args)

    def serve(self, message: dict) -> None:
        """Carry out one request on one of our objects, and reply (or send its exception)."""
        try:
            target, args = self.mine[message["id"]], self.into(message["args"])
            self.allow(target, message["what"], args)
            value = self.out(self.perform(target, message["what"], args))
            reply = {"op": "reply", "value": value}
        except Exception as exc:  # the object raised: the other side sees it, as in-process
            self.raised[id(exc)] = exc
            reply = {"op": "error", "exc": describe(exc, id(exc))}
        self.send(reply)


def perform(target, what: str, args: list):
    """What one request does to ``target``: a public attribute, a call, a protocol, SQL."""
    if what in ("getattr", "setattr", "method") and (
        not isinstance(args[0], str) or args[0].startswith("_")
    ):
        raise AttributeError(f"{args[0]!r}: only public attributes can be reached")
    if what == "method":
        return getattr(target, args[0])(*args[1], **args[2])
    if what == "getattr":
        return getattr(target, args[0])
    if what == "setattr":
        return setattr(target, args[0], args[1])
    if what == "call":
        return target(*args[0], **args[1])
    if what in ("execute", "executemany", "executescript"):
        cursor = getattr(target, what)(*args)
        rows, names = _rows(cursor), cursor.description
        names = None if names is None else [d[0] for d in names]
        return {
            "rows": rows,
            "rowcount": cursor.rowcount,
            "lastrowid": cursor.lastrowid,
            "description": names,
        }
    if what == "exit":
        exc = None if args[0] is None else rebuild(args[0], keep_name=False)
        return target.__exit__(None if exc is None else type(exc), exc, None)
    if what == "getitem":
        return target[args[0]]
    simple = {
        "commit": lambda t: t.commit(),
        "rollback": lambda t: t.rollback(),
        "close": lambda t: t.close(),
        "enter": lambda t: t.__enter__(),
        "list": list,
        "len": len,
        "bool": bool,
        "repr": repr,
    }
    if what not in simple:
        raise AttributeError(f"no such request {what!r}")
    return simple[what](target)


def _rows(cursor) -> list:
    """The cursor's rows, refused once they pass what one message carries (:data:`LIMIT`): a
    result too large to cross does not fill the memory of the side that runs the SQL first."""
    rows, size = [], 0
    for row in cursor:
        size += sum(len(v) if isinstance(v, (str, bytes)) else 8 for v in row)
        if size > LIMIT:
            raise ValueError(f"a result of over {LIMIT} bytes: it cannot cross to the answer")
        rows.append(row)
    return rows


class Remote:
    """Any object of the other side: attribute reads, calls and protocols are requests."""

    __slots__ = ("_labkit_peer", "_labkit_id", "_labkit_class", "_labkit_methods")

    def __init__(self, peer: Peer, ident, cls=None, methods=()) -> None:
        object.__setattr__(self, "_labkit_peer", peer)
        object.__setattr__(self, "_labkit_id", ident)
        object.__setattr__(self, "_labkit_class", cls)
        object.__setattr__(self, "_labkit_methods", methods)

    @property
    def __class__(self):  # isinstance(proxy, EpochAuthority) holds: labkit's checks accept it
        return object.__getattribute__(self, "_labkit_class") or Remote

    def _ask(self, what: str, *args):
        get = object.__getattribute__
        return get(self, "_labkit_peer").request(get(self, "_labkit_id"), what, *args)

    def __getattr__(self, name):
        if name in object.__getattribute__(self, "_labkit_methods"):
            return lambda *args, **kwargs: self._ask("method", name, list(args), kwargs)
        return self._ask("getattr", name)

    def __setattr__(self, name, value):
        self._ask("setattr", name, value)

    def __call__(self, *args, **kwargs):
        return self._ask("call", list(args), kwargs)

    def __iter__(self):
        return iter(self._ask("list"))

    def __len__(self):
        return self._ask("len")

    def __getitem__(self, key):
        return self._ask("getitem", key)

    def __bool__(self):
        return self._ask("bool")

    def __enter__(self):
        return self._ask("enter")

    def __exit__(self, kind, exc, tb):
        return self._ask("exit", None if exc is None else describe(exc))

    def __repr__(self):
        return self._ask("repr")
