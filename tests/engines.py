"""The contract suite's two databases: SQLite files, and one throwaway PostgreSQL per session.

A test of a contract module (``CONTRACT``) that uses ``db`` runs once per engine, as
``test_x[sqlite]`` and ``test_x[postgres]``, unless it is listed in ``SQLITE_ONLY`` with its
reason. Each PostgreSQL test gets a fresh schema (its ``search_path``), dropped afterwards. The
PostgreSQL half skips loudly without the binaries, and fails instead under
``LABKIT_REQUIRE_POSTGRES=1``.
"""

from __future__ import annotations

import itertools

from prerequisites import require

ENGINES = ("sqlite", "postgres")
CONTRACT = {
    "test_lease",
    "test_fence",
    "test_idempotency",
    "test_hostile_input",
    "test_contract_processes",
    "test_core_holes",
}

# Each stays SQLite-only, for the reason given.
SQLITE_ONLY = {
    # test_lease
    "test_lease_is_a_frozen_value_that_checks_its_fields": "no database involved",
    # test_fence
    "test_tx_db_inserts_stay_in_the_guards_transaction": "tx.db is sqlite-utils (test_tx_db_is_refused_on_postgres)",
    "test_a_sqlite_utils_insert_of_a_stale_row_inside_a_guard_is_stale_generation": "tx.db is sqlite-utils",
    "test_ensure_schema_reprobes_under_the_lock_so_a_racing_install_is_not_an_error": "sqlite3 trace callback; sqlite_master",
    "test_a_new_fence_and_a_store_can_be_made_inside_an_open_transaction": "FencedFileStore installs its schema through sqlite_master",
    "test_protected_rows_must_carry_an_integer_token_and_a_job": "a typeless column is SQLite's (test_protected_rows_need_a_token_and_a_job_on_postgres)",
    "test_protect_refuses_unusable_tables_and_changes_nothing": "creates its tables in SQLite's syntax (a typeless view)",
    # test_idempotency: none
    # test_hostile_input: the mechanisms (effects, recovery, timing) and SQLite files
    "test_a_connection_with_implicit_transactions_is_refused": "sqlite3's isolation_level",
    "test_the_matrix_covers_every_public_entry_point": "no database involved",
    "test_a_read_only_database_refuses_writes_naming_db": "a read-only SQLite file",
    "test_a_read_only_database_still_answers_reads": "a read-only SQLite file",
    "test_connect_to_a_file_that_is_not_sqlite_names_path_and_leaves_it_alone": "a SQLite file",
    "test_connect_to_an_unusable_path_names_path": "a SQLite path",
    "test_connect_waits_out_a_lock_then_raises_busy_without_installing_anything": "SQLite's file lock",
}


def missing_prerequisite() -> str | None:
    """Why the PostgreSQL half cannot run here, or None."""
    from labkit.engines import postgres
    from labkit.errors import LabkitError

    try:
        postgres.require()
        import psycopg  # noqa: F401
    except (LabkitError, ImportError) as exc:
        return str(exc)
    return None


def require_postgres() -> None:
    """Skip loudly, or fail under LABKIT_REQUIRE_POSTGRES=1, if PostgreSQL can't run."""
    require("PostgreSQL tests", missing_prerequisite(), "LABKIT_REQUIRE_POSTGRES")


def parametrize(metafunc) -> None:
    """pytest_generate_tests: run a contract test on both engines unless it is SQLite-only."""
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    name = metafunc.function.__name__
    marks = metafunc.definition.iter_markers("parametrize")
    if any("engine" in str(mark.args[0]) for mark in marks):  # the test lists its own engines
        return
    if module in CONTRACT and "engine" in metafunc.fixturenames and name not in SQLITE_ONLY:
        metafunc.parametrize("engine", ENGINES, indirect=True)


_schemas = itertools.count(1)


#: the session server trades durability for speed (no fsync, commits not awaited: nothing here
#: crashes it); the crash-and-restart tests start their own server with the defaults
FAST = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "deadlock_timeout": "100ms",
}


class Schema:
    """A fresh schema on the session's server: ``url`` puts it first on the search_path.
    ``admin`` is the session's own connection (autocommit), which this schema borrows."""

    def __init__(self, server, admin) -> None:
        self.name = f"t{next(_schemas)}"
        self.server, self.admin = server, admin
        self.url = self.url_with()
        self.admin.execute(f"CREATE SCHEMA {self.name}")

    def url_with(self, *settings: str) -> str:
        """This schema's URL, with more ``-c`` settings (e.g. ``default_transaction_read_only=on``)."""
        options = " ".join(f"-c{s}" for s in (f"search_path={self.name}", *settings))
        return self.server.url_for(options=options, application_name=self.name)

    def dump(self) -> list:
        """Every table's rows in this schema, and its triggers, read through another connection."""
        rows = []
        tables = self.admin.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s ORDER BY 1",
            [self.name],
        ).fetchall()
        for (table,) in tables:
            quoted = '"' + table.replace('"', '""') + '"'
            found = self.admin.execute(f"SELECT * FROM {self.name}.{quoted}").fetchall()
            rows.append((table, sorted(found, key=repr)))
        triggers = """SELECT c.relname, t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
            WHERE c.relnamespace = %s::regnamespace AND NOT t.tgisinternal ORDER BY 1, 2"""
        rows.append(("triggers", self.admin.execute(triggers, [self.name]).fetchall()))
        return rows

    def drop(self) -> None:
        """End every connection of this test, then drop its schema."""
        sql = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s"
        self.admin.execute(sql, [self.name])
        self.admin.execute(f"DROP SCHEMA {self.name} CASCADE")
