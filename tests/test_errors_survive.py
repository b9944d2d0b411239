"""A labkit error raised inside a simulated worker reaches the caller as itself, with its data:
simpy copies an error between processes as ``type(e)(*e.args)``, which the engine must survive."""

import importlib
import inspect
import pathlib
import pkgutil

import pytest

import labkit
from labkit.errors import LabkitError
from labkit.sim.engine import Sim
from labkit.sim.worker import Crashed

for _module in pkgutil.walk_packages(labkit.__path__, "labkit."):
    importlib.import_module(_module.name)  # every module, so that every subclass is defined


def subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from subclasses(sub)


ERRORS = sorted(set(subclasses(LabkitError)) | {LabkitError}, key=lambda c: c.__qualname__)
SAMPLES = {str: "lease-x", int: 7, float: 2.5, pathlib.Path: pathlib.Path("/nowhere")}


def example(cls) -> LabkitError:
    """An instance of ``cls`` made from sample values of its constructor's parameters, the last
    given by keyword (as callers do for optional data)."""
    params = [p for p in inspect.signature(cls.__init__).parameters.values()][1:]
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return cls("a plain message")
    values = []
    for p in params:
        kind = p.annotation if isinstance(p.annotation, type) else None
        text = str(p.annotation)
        kind = kind or next((t for t in SAMPLES if t.__name__ in text and "None" not in text), str)
        values.append((p.name, SAMPLES.get(kind, "a value")))
    positional = [v for _, v in values[:-1]]
    return cls(*positional, **dict(values[-1:]))


def data(error) -> dict:
    """What an error carries: its public attributes and its message."""
    public = {k: v for k, v in vars(error).items() if not k.startswith("_")}
    return {**public, "message": str(error), "type": type(error)}


def test_every_labkit_error_is_found():
    """The errors of the core, the simulation, the engines and the grader are all checked."""
    names = {c.__name__ for c in ERRORS}
    assert {"LeaseHeld", "LeaseLost", "StaleGeneration", "Crashed", "NoResponse"} <= names
    assert {"MissingBinary", "CheckFailed", "Unreachable"} <= names


@pytest.mark.parametrize("cls", ERRORS, ids=[c.__qualname__ for c in ERRORS])
@pytest.mark.parametrize("how", ["worker", "bare process", "awaited process"])
def test_an_error_raised_in_a_simulated_process_leaves_the_run_as_itself(cls, how):
    """Raised in a worker's body (Sim.start), in a bare simpy process, or in a process that
    another one waits for, the error Sim.run raises is the very one raised, data and all."""
    error = example(cls)
    expected = data(error)

    def body(*_):
        yield from ()
        raise error

    with Sim(seed=0) as sim:
        if how == "worker":
            sim.start(sim.worker("A"), body)
        elif how == "bare process":
            sim.env.process(body())
        else:
            inner = sim.env.process(body())

            def waiter():
                yield inner

            sim.env.process(waiter())
        if how == "worker" and cls is Crashed:  # a crash ends its worker, by design
            sim.run()
            assert not sim.processes["A"].is_alive
            return
        with pytest.raises(cls) as raised:
            sim.run()
    assert raised.value is error and data(raised.value) == expected
