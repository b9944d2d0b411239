"""The judge's records live outside every file the answer's SQL reaches (issue 22).

07.2's record of the invoices it issued is the judge's evidence of a repeat. A wrong answer (no
operation id: a successor issues again what its crashed predecessor issued) is wrapped, its logic
unchanged, in SQL that goes for that record by every route: the table by name, written or read,
SQLite's own catalogue and sequence, a rename, a TEMP shadow, ATTACH of the trial's file, the
listing pragmas, or undoing the invoice row the judge wrote while the transaction still commits.
Whatever the wrapper finds it uses (it skips a unit already invoiced), and anything of the
judge's that it sees fails it loudly; each wrapped answer finds nothing and scores no more than
the bare one.
"""

import pytest

import corpus_part2
from answers import against_bare, judged
from labkit.grading import policy

BARE = corpus_part2.CORPUS["07.2"]["wrong"]["no operation id"][0]

WRAP = '''
_bare = run_job
def run_job(claims, claim, units, issue_invoice, *, every):
    conn = claims.db.conn
    def seen():
        """What the route shows of the judge's record: the units it invoiced."""
        try:
            rows = conn.execute({read!r}).fetchall()
        except Exception:  # SQLite's own error (no such table): the route shows nothing
            return set()
        foreign = [r for r in rows if r and str(r[0]) not in {ours!r}]  # not labkit's table
        if foreign:
            raise RuntimeError(f"found the judge's records: {{foreign}}")
        return {{str(r[-1]) for r in rows if r}}
    def issue(tx, unit, amount):
        if unit in seen():
            return None
        number = issue_invoice(tx, unit, amount)
        for sql in {after!r}:  # what it does to the record once the invoice is issued
            try:
                changed = conn.execute(sql, [number] if "?" in sql else []).rowcount
            except Exception:
                continue
            if changed > 0 and "invoices" not in sql:  # a row of the judge's
                raise RuntimeError(f"found the judge's records: {{sql}} changed {{changed}}")
        return number
    return _bare(claims, claim, units, issue, every=every)
'''
ROUTES = {  # (what it reads before each invoice, what it does after it)
    "reads the issued table by name": ("SELECT number, unit FROM issued", ()),
    "reads it in upper case, through main": ('SELECT number, unit FROM main."ISSUED"', ()),
    "deletes its own repeats from the issued table": ("SELECT 1 WHERE 0", ("DELETE FROM issued WHERE number = ?",)),
    "lists SQLite's catalogue": ("SELECT name, name FROM sqlite_master WHERE type = 'table'", ()),
    "lists the temp catalogue": ("SELECT name, name FROM temp.sqlite_master", ()),
    "reads SQLite's sequence of the judge's numbers": ("SELECT name, seq FROM sqlite_sequence", ()),
    "rewinds the judge's numbers in sqlite_sequence": (
        "SELECT 1 WHERE 0", ("UPDATE sqlite_sequence SET seq = 0 WHERE name = 'issued'",)),
    "renames the issued table, then reads it": (
        "SELECT number, unit FROM mine", ("ALTER TABLE issued RENAME TO mine",)),
    "shadows the invoices with a TEMP table": (
        "SELECT 1 WHERE 0", ("CREATE TEMP TABLE invoices AS SELECT * FROM main.invoices",)),
    "shadows the issued table with a TEMP one": (
        "SELECT 1 WHERE 0", ("CREATE TEMP TABLE issued (number INTEGER, unit TEXT)",)),
    "attaches the trial's file again": (
        "SELECT number, unit FROM again.issued", ("ATTACH DATABASE 'check.db' AS again",)),
    "lists the tables (pragma table_list)": ("PRAGMA table_list", ()),
    "lists the files (pragma database_list)": ("PRAGMA database_list", ()),
    "reads the issued table's shape (pragma table_info)": ("PRAGMA table_info(issued)", ()),
    "a table-valued pragma lists the tables": ("SELECT name, name FROM pragma_table_list", ()),
    "deletes the invoice row the judge wrote, in the same transaction": (
        "SELECT 1 WHERE 0", ("DELETE FROM invoices WHERE invoice_id = 'INV-' || ?",)),
    "rolls the invoice back to a savepoint, and commits the rest": (
        "SELECT 1 WHERE 0", ("ROLLBACK TO before_invoice", "RELEASE before_invoice")),
}


def _wrapped(read: str, after: tuple) -> str:
    source = BARE + WRAP.format(read=read, after=after, ours=sorted(policy.TABLES))
    if "before_invoice" in str(after):  # a savepoint just before the effect
        source = source.replace("        number = issue_invoice(",
                                "        conn.execute('SAVEPOINT before_invoice')\n"
                                "        number = issue_invoice(")
    return source


@pytest.fixture(scope="module")
def scored():
    sources = {"bare": BARE} | {how: _wrapped(*route) for how, route in ROUTES.items()}
    return judged("07.2", "run_job", sources, run=22)


@pytest.mark.parametrize("how", sorted(ROUTES))
def test_the_judges_record_of_issued_invoices_is_out_of_reach(scored, how):
    """Each route finds nothing of the judge's record, and the wrapped wrong answer scores no
    more than the bare one."""
    bare, wrapped = scored["bare"], scored[how]
    against_bare("read or change the judge's records through SQL", how, "07.2", bare, wrapped)
    assert bare.total()[0] > 0 and not bare.passed, bare.text()  # wrong, not broken
    assert "found the judge's records" not in wrapped.text(), wrapped.text()
    assert wrapped.total()[0] <= bare.total()[0], (wrapped.text(), bare.text())


def test_an_invoice_undone_while_its_transaction_commits_is_named(scored):
    """Taking out the row of an invoice the judge issued (deleting it, or rolling back to a
    savepoint before it) while the transaction commits is named on the scorecard, not counted."""
    for how in ("deletes the invoice row the judge wrote, in the same transaction",
                "rolls the invoice back to a savepoint, and commits the rest"):
        text = scored[how].text()
        assert "the answer undid invoices the judge issued" in text and scored[how].total()[0] == 0, text
