"""The public API: every exported name exists, is documented, and is in the README."""

import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import labkit

README = Path(__file__).resolve().parent.parent / "README.md"
#: the lessons' mechanisms and the checker, each in its own namespace (not in labkit.__all__)
ELSEWHERE = {
    "labkit.mechanisms.timing": ["conservative_deadline", "LeaseKeeper", "backoff", "VersionLease"],
    "labkit.mechanisms.issuers": ["EpochIssuer", "EpochAuthority"],
    "labkit.mechanisms.recovery": ["Claims"],
    "labkit.mechanisms.effects": ["FencedFileStore", "EmailProvider", "PaymentProvider", "Outbox", "ETagStore"],
    "labkit.sim": ["check", "Event", "Violation"],
}
CORE = ["labkit.clock", "labkit.db", "labkit.errors", "labkit.fence", "labkit.idempotency", "labkit.lease"]


def summary(obj) -> str:
    """The first line of ``obj``'s own docstring, or ''."""
    doc = inspect.getdoc(obj) or ""
    return doc.strip().splitlines()[0].strip() if doc.strip() else ""


def public_members(cls):
    """(name, object) for the public methods and properties a class defines itself."""
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(member, (staticmethod, classmethod)):
            member = member.__func__
        if inspect.isfunction(member) or isinstance(member, property):
            yield name, member


def exported():
    """Every (qualified name, object) that labkit's API promises: __all__ and the core modules' __all__."""
    import importlib
    seen = {}
    for name in labkit.__all__:
        seen[f"labkit.{name}"] = getattr(labkit, name, None)
    for module_name, names in ELSEWHERE.items():
        module = importlib.import_module(module_name)
        seen.update({f"{module_name}.{name}": getattr(module, name, None) for name in names})
    for module_name in CORE:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            seen.setdefault(f"{module_name}.{name}", getattr(module, name, None))
    return sorted(seen.items())


def test_every_name_in_all_exists():
    """Each name in labkit.__all__ is an attribute of labkit, and __all__ has no repeats."""
    missing = [name for name in labkit.__all__ if not hasattr(labkit, name)]
    assert missing == []
    assert len(labkit.__all__) == len(set(labkit.__all__))


@pytest.mark.parametrize("qualified, obj", exported(), ids=[q for q, _ in exported()])
def test_every_exported_name_has_a_summary_line(qualified, obj):
    """Every exported function and class has a docstring whose first line is a sentence."""
    if not (inspect.isclass(obj) or callable(obj)):
        pytest.skip(f"{qualified} is a constant")
    line = summary(obj)
    assert line, f"{qualified} has no docstring"
    assert line.endswith((".", ":")) or line.endswith(")"), f"{qualified}: summary {line!r} is not a sentence"


def methods():
    """Every public method and property of every exported class."""
    out = []
    for qualified, obj in exported():
        if inspect.isclass(obj):
            out += [(f"{qualified}.{name}", member) for name, member in public_members(obj)]
    return out


@pytest.mark.parametrize("qualified, member", methods(), ids=[q for q, _ in methods()])
def test_every_public_method_has_a_docstring(qualified, member):
    """Every public method and property of an exported class has its own docstring."""
    assert summary(member), f"{qualified} has no docstring"


CORE_CALLABLES = ["connect", "VirtualClock", "LeaseAuthority", "Fence", "run_once"]


@pytest.mark.parametrize("name", CORE_CALLABLES)
def test_the_core_docstrings_show_an_example(name):
    """The core's five entry points carry a short example; a class's one example shows its methods."""
    assert ">>>" in (inspect.getdoc(getattr(labkit, name)) or ""), f"{name} has no example"


@pytest.mark.parametrize("name, methods", [("LeaseAuthority", ["acquire", "try_acquire", "renew",
                                                                "release", "current"]),
                                            ("Fence", ["guard", "current"])])
def test_one_class_example_shows_the_sibling_methods_together(name, methods):
    """LeaseAuthority's example acquires, renews and releases; Fence's guards and reads current."""
    doc = inspect.getdoc(getattr(labkit, name))
    assert [m for m in methods if f".{m}(" not in doc] == []


def test_import_labkit_loads_the_core_only():
    """In a fresh interpreter, `import labkit` gives at most 20 names and loads none of simpy,
    numpy, matplotlib or sqlite-utils; a first connect loads sqlite-utils (which loads numpy),
    and still neither simpy nor matplotlib."""
    code = """if True:
        import json, sys
        import labkit
        heavy = ["simpy", "numpy", "matplotlib", "sqlite_utils"]
        before = [m for m in heavy if m in sys.modules]
        labkit.LeaseAuthority(labkit.connect(), labkit.VirtualClock()).acquire("job", "A", 10)
        after = [m for m in heavy if m in sys.modules]
        print(json.dumps([len(labkit.__all__), before, after]))
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [19, [], ["numpy", "sqlite_utils"]]


def test_every_name_in_all_appears_in_the_readme():
    """README.md mentions every public name (the API table stays in step with __all__)."""
    text = README.read_text(encoding="utf-8")
    names = [*labkit.__all__, *(n for names in ELSEWHERE.values() for n in names)]
    missing = [name for name in names if not re.search(rf"\b{re.escape(name)}\b", text)]
    assert missing == []


@pytest.mark.parametrize("module_name", CORE)
def test_the_core_examples_run_as_written(module_name):
    """Every example in the core's docstrings runs and prints what it shows (doctest)."""
    import doctest
    import importlib
    result = doctest.testmod(importlib.import_module(module_name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted > 0 or module_name == "labkit.errors"
