"""labkit.processes.chaos: a seeded nemesis against real processes; protected passes, unprotected is caught."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from labkit.processes.chaos import main, schedule


def test_the_same_seed_gives_the_same_plan():
    """The nemesis's plan is a pure function of the seed (and the run's shape); another seed differs."""
    plan = schedule(7, workers=3, seconds=4, ttl=0.4)
    assert plan == schedule(7, workers=3, seconds=4, ttl=0.4)
    assert plan != schedule(8, workers=3, seconds=4, ttl=0.4)
    kinds = {a.kind for a in plan}
    assert {"freeze_holder", "kill_in_tx", "pause"} <= kinds
    pauses = [a.seconds for a in plan if a.kind == "pause"]
    assert all(0.05 <= s <= 3 * 0.4 for s in pauses)
    holder_freezes = [a.seconds for a in plan if a.kind == "freeze_holder"]
    assert all(s >= 3 * 0.4 for s in holder_freezes)          # longer than any lease
    assert [a.at for a in plan] == sorted(a.at for a in plan) and plan[-1].at < 0.7 * 4


def chaos(folder, *flags: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "labkit.chaos", "--workers", "3", "--seconds", "4", "--min-commits", "5",
                             "--seed", "7", "--dir", str(folder), *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def figure(text: str, pattern: str) -> int:
    found = re.search(pattern, text)
    assert found, f"{pattern!r} not in the output:\n{text}"
    return int(found.group(1))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The short chaos run, protected and unprotected, with the same seed (side by side)."""
    folder = tmp_path_factory.mktemp("chaos")
    started = chaos(folder), chaos(folder, "--unprotected")
    done = [(p, *p.communicate(timeout=120)) for p in started]
    return [subprocess.CompletedProcess(p.args, p.returncode, out, err) for p, out, err in done]


def test_protected_chaos_has_no_violation(runs):
    """Protected: holders frozen past their lease and kills inside BEGIN IMMEDIATE, and zero violations."""
    protected = runs[0]
    out = protected.stdout
    assert protected.returncode == 0, out + protected.stderr
    assert "violations: none" in out
    assert "ledger: every invoice equals the sum of its charge lines" in out
    assert figure(out, r"\((\d+) inside BEGIN IMMEDIATE\)") >= 1
    assert figure(out, r"\((\d+) of a lease holder past its lease\)") >= 1
    assert figure(out, r"committed: (\d+)") >= 5
    assert "s  commits" in protected.stderr                   # the progress line
    png = re.search(r"timeline: (\S+)", out).group(1)
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_unprotected_chaos_is_caught(runs):
    """Unprotected, the same seed's faults let stale writes land, and the checker reports them (exit 1)."""
    unprotected = runs[1]
    out = unprotected.stdout
    assert unprotected.returncode == 1, out + unprotected.stderr
    assert figure(out, r"stale_accepted (\d+)") >= 1
    assert figure(out, r"lost_update (\d+)") >= 1
    assert "its lines sum to" in out                           # money really went missing
    assert figure(out, r"\((\d+) inside BEGIN IMMEDIATE\)") >= 1


def test_both_runs_played_the_same_plan(runs):
    """The protected and unprotected runs with one seed report the same nemesis plan."""
    plans = [re.search(r"nemesis plan (\w+)", r.stdout).group(1) for r in runs]
    assert plans[0] == plans[1]


def test_bad_arguments_are_refused(capsys):
    """Too few workers or too short a run is a usage error, before any process starts."""
    with pytest.raises(SystemExit) as usage:
        main(["--workers", "1", "--seconds", "4"])
    assert usage.value.code == 2 and "workers" in capsys.readouterr().err


def test_the_tempo_follows_the_lease():
    """With etcd's 1 s leases the same seed's plan is played 2.5 times slower: same steps, later."""
    fast = schedule(7, workers=3, seconds=4, ttl=0.4)
    slow = schedule(7, workers=3, seconds=10, ttl=1.0)
    assert [a.kind for a in slow] == [a.kind for a in fast]
    assert [a.at for a in slow] == pytest.approx([2.5 * a.at for a in fast], abs=0.002)
    pauses = [a.seconds for a in slow if a.kind == "pause"]
    assert all(0.125 - 0.001 <= s <= 3.0 for s in pauses)


def test_an_unknown_issuer_is_refused_before_anything_starts(tmp_path):
    """Only sqlite and etcd issue the leases; another name is refused, naming issuer."""
    from labkit.errors import BadArgument
    from labkit.processes.chaos import run

    with pytest.raises(BadArgument, match="issuer"):
        run(2, 2, issuer="redis", root=tmp_path)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(SystemExit):
        main(["--issuer", "redis"])


def test_a_run_that_has_not_done_its_job_goes_on_and_its_workers_with_it(tmp_path):
    """A run that asks for more commits than it can make by its time goes on, a second at a
    time, to three times its length, says so, and its workers keep committing past the first
    end (the committed lines' times show it); then it stops, its job still undone."""
    import sqlite3

    from labkit.processes.chaos import run

    summary, code = run(2, 2, seed=3, root=tmp_path, min_commits=10**6)
    assert "the run went on to 6 s" in summary, summary
    (folder,) = tmp_path.iterdir()
    with sqlite3.connect(folder / "lab.db") as db:
        times = [t for (t,) in db.execute("SELECT time FROM invoice_lines")]
    assert [t for t in times if t > 3], f"no worker committed after the first end: {times}"
    assert max(times) < 6 + 1, "a worker committed past the run's last end"
    assert code in (0, 2), summary
