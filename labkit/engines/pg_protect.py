"""``Fence.protect`` on PostgreSQL: PL/pgSQL triggers with SQLite's rules.

A row written into a protected table with a token below its job's fence is refused, from any
connection. The check locks the fence row (``FOR UPDATE``), so a writer waits for a guard that
holds it and then judges the committed fence, not an older snapshot. Where the lease authority
lives in the same database (a ``lease_counter`` row named like the job), a token above the last
generation it issued is refused: nobody was ever given it. A row really written raises its fence
after the row (``ON CONFLICT DO NOTHING`` may skip it); PostgreSQL runs AFTER ROW triggers at the
end of the statement, so the raise judges each row again, in order, and a multi-row INSERT with
any row below an earlier one is refused whole, as on SQLite. The fence rows themselves are never
lowered, renamed, deleted or truncated. Tokens compare as ``(0, token)`` against the fence's
``(epoch, generation)``, the order ``guard`` uses.

The functions live in the table's schema and name it in every reference, with
``search_path = schema, pg_temp``: a writer's TEMP ``job_fence`` is never the one they read.
The RAISE texts are the SQLite triggers' texts, so ``labkit.db`` reports them as the same
errors.
"""

from __future__ import annotations

import hashlib

from labkit import db as core
from labkit.errors import BadArgument

__all__ = ["protect"]

COLUMNS = """SELECT c.column_name, c.data_type FROM information_schema.columns AS c
    JOIN information_schema.tables AS t USING (table_schema, table_name)
    WHERE c.table_schema = current_schema() AND c.table_name = $1 AND t.table_type = 'BASE TABLE'"""
INTEGERS = {"smallint", "integer", "bigint"}


def protect(db, table: str, column: str) -> None:
    """Install the triggers on ``table`` (its token in ``column``); idempotent."""
    schema = db.run("SELECT current_schema()").fetchone()[0]
    if schema is None or schema.startswith("pg_temp"):
        raise BadArgument("table", "protect() needs a schema on the search_path, not pg_temp")
    columns = dict(db.run(COLUMNS, [table]).fetchall())
    if not columns:
        raise BadArgument("table", f"there is no table named {table!r}")
    if "job_id" not in columns:
        raise BadArgument("table", f"{table!r} has no job_id column, the fenced job of a row")
    if column not in columns:
        raise BadArgument("column", f"{table!r} has no column {column!r}")
    if columns[column] not in INTEGERS:
        raise BadArgument("column", f"{column!r} is {columns[column]}, not an integer column")
    names = {"schema": core.quote(schema), "column": core.quote(column)}
    names["table"] = f"{names['schema']}.{core.quote(table)}"
    names["literal"] = "'" + column.replace("'", "''") + "'"
    tag = hashlib.sha1(f"{column}".encode()).hexdigest()[:12]
    with core.transaction(db):
        db.run("SELECT pg_advisory_xact_lock(hashtext('labkit schema'))")
        for statement in (*ONCE, RAISE_EXISTING):
            db.run(statement.format(**names))
        for when, what in (("BEFORE", "check"), ("AFTER", "raise")):
            name = core.quote(f"labkit_fence_{tag}_{what}")
            db.run(TRIGGER.format(name=name, when=when, what=what, **names))


RAISE_EXISTING = """INSERT INTO {schema}.job_fence(job_id, epoch, generation)
    SELECT job_id, 0, max({column}) FROM {table}
    WHERE {column} IS NOT NULL AND job_id IS NOT NULL GROUP BY job_id
    ON CONFLICT (job_id) DO UPDATE SET generation = excluded.generation
    WHERE job_fence.epoch = 0 AND job_fence.generation < excluded.generation"""

TRIGGER = """CREATE OR REPLACE TRIGGER {name} {when} INSERT OR UPDATE ON {table}
    FOR EACH ROW EXECUTE FUNCTION {schema}.labkit_fence_{what}({literal})"""

# Each function names its schema: nothing a writer puts on the search_path is read instead.
ONCE = (
    """CREATE OR REPLACE FUNCTION {schema}.labkit_fence_check() RETURNS trigger
    LANGUAGE plpgsql SET search_path = {schema}, pg_temp AS $$
    DECLARE token bigint; fence record; issued bigint;
    BEGIN
        token := (to_jsonb(NEW) ->> TG_ARGV[0])::bigint;
        IF token IS NULL THEN RAISE EXCEPTION 'labkit: generation must be an integer'; END IF;
        IF NEW.job_id IS NULL THEN RAISE EXCEPTION 'labkit: job_id must not be NULL'; END IF;
        SELECT epoch, generation INTO fence FROM {schema}.job_fence
            WHERE job_id = NEW.job_id FOR UPDATE;
        IF NOT FOUND THEN RAISE EXCEPTION 'labkit: no fence row for this job'; END IF;
        IF (0, token) < (fence.epoch, fence.generation) THEN
            RAISE EXCEPTION 'labkit: stale generation'
                USING DETAIL = fence.epoch || ',' || fence.generation;
        END IF;
        SELECT generation INTO issued FROM {schema}.lease_counter WHERE name = NEW.job_id;
        IF token > issued THEN
            RAISE EXCEPTION 'labkit: generation was never issued' USING DETAIL = 0 || ',' || issued;
        END IF;
        RETURN NEW;
    END $$""",
    """CREATE OR REPLACE FUNCTION {schema}.labkit_fence_raise() RETURNS trigger
    LANGUAGE plpgsql SET search_path = {schema}, pg_temp AS $$
    DECLARE token bigint := (to_jsonb(NEW) ->> TG_ARGV[0])::bigint; fence record;
    BEGIN
        SELECT epoch, generation INTO fence FROM {schema}.job_fence
            WHERE job_id = NEW.job_id FOR UPDATE;
        IF (0, token) < (fence.epoch, fence.generation) THEN  -- below an earlier row's raise
            RAISE EXCEPTION 'labkit: stale generation'
                USING DETAIL = fence.epoch || ',' || fence.generation;
        END IF;
        UPDATE {schema}.job_fence SET generation = token
        WHERE job_id = NEW.job_id AND epoch = 0 AND generation < token;
        RETURN NULL;
    END $$""",
    """CREATE OR REPLACE FUNCTION {schema}.labkit_fence_row() RETURNS trigger
    LANGUAGE plpgsql SET search_path = {schema}, pg_temp AS $$
    BEGIN
        IF TG_OP <> 'UPDATE' OR NEW.job_id IS DISTINCT FROM OLD.job_id THEN
            RAISE EXCEPTION 'labkit: a fence row is never deleted';
        END IF;
        IF (NEW.epoch, NEW.generation) < (OLD.epoch, OLD.generation) THEN
            RAISE EXCEPTION 'labkit: stale generation'
                USING DETAIL = OLD.epoch || ',' || OLD.generation;
        END IF;
        RETURN NEW;
    END $$""",
    """CREATE OR REPLACE TRIGGER labkit_fence_never_lower BEFORE UPDATE OR DELETE
    ON {schema}.job_fence FOR EACH ROW EXECUTE FUNCTION {schema}.labkit_fence_row()""",
    """CREATE OR REPLACE TRIGGER labkit_fence_never_truncated BEFORE TRUNCATE
    ON {schema}.job_fence FOR EACH STATEMENT EXECUTE FUNCTION {schema}.labkit_fence_row()""",
)
