"""MySQL / MariaDB: what differs from the shared SQL load (`sql.warehouse.SqlWarehouse`).

Executors `LOAD DATA LOCAL INFILE` each chunk into its own InnoDB staging table; the shared commit
moves a pair's chunks into the target with INSERT ... SELECT (`ON DUPLICATE KEY UPDATE` with a
primary key) and writes the load markers in the same transaction. Values are not CAST: the
session's strict mode (`STRICT_ALL_TABLES`) makes text that is not a number an error when it is
assigned to a BIGINT column, where CAST would only warn and store 0. Stream rows go as multi-row
INSERTs with parameters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from eventspark.destinations.base import STAGE_PREFIX, TerminalError
from eventspark.destinations.mysql.capabilities import CAPABILITIES
from eventspark.destinations.mysql.client import (
    DUPLICATE_COLUMN,
    ConnectInfo,
    MySQLClient,
    MySQLStageTarget,
    connect_info_of,
    mysql_datetime,
    pct,
)
from eventspark.destinations.mysql.configuration import MySQLDestination
from eventspark.destinations.mysql.dialect import (
    DIALECT,
    EXACT_COLLATIONS,
    KEY_TEXT_TYPE,
    TABLE_OPTIONS,
    data_type_of,
    key_column_type,
    quote,
)
from eventspark.destinations.sql.warehouse import SqlClient, SqlWarehouse
from eventspark.steps.diff import Table
from eventspark.steps.typing import DataType

INSERT_ROWS = 1000
"""Rows per multi-row INSERT in stream mode (well under the default 16 MB max_allowed_packet)."""


def build(dest_id: str, dest: MySQLDestination, events_dir: Path) -> MySQLWarehouse:
    return MySQLWarehouse(dest_id, connect_info_of(dest), dest.datasource.db)


class MySQLWarehouse(SqlWarehouse):
    """A MySQL database (`datasource.db`, created when missing)."""

    dialect = DIALECT
    capabilities = CAPABILITIES
    CREATE_SCHEMA = "CREATE DATABASE IF NOT EXISTS {schema} CHARACTER SET utf8mb4"
    MARKER_TABLE = (
        "CREATE TABLE IF NOT EXISTS {name} (dest_id VARCHAR(128) NOT NULL, file VARCHAR(255) NOT NULL, "
        "table_name VARCHAR(64) NOT NULL, loaded_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP, "
        "PRIMARY KEY (dest_id, file, table_name)) " + TABLE_OPTIONS.format("utf8mb4_bin")
    )

    def __init__(self, dest_id: str, info: ConnectInfo, db: str) -> None:
        super().__init__(dest_id, db)
        self.info = info
        self._options = TABLE_OPTIONS.format(EXACT_COLLATIONS[-1])

    def _connect(self) -> MySQLClient:
        client = MySQLClient(self.info)
        try:
            self._options = TABLE_OPTIONS.format(self._collation(client))
        except BaseException:
            client.close()
            raise
        return client

    @staticmethod
    def _collation(client: MySQLClient) -> str:
        """The best exact collation the server has (see EXACT_COLLATIONS)."""
        marks = ", ".join(["%s"] * len(EXACT_COLLATIONS))
        query = f"SELECT COLLATION_NAME FROM information_schema.COLLATIONS WHERE COLLATION_NAME IN ({marks})"
        found = {name for (name,) in client.rows(query, "connecting", EXACT_COLLATIONS)}
        return next((c for c in EXACT_COLLATIONS if c in found), EXACT_COLLATIONS[-1])

    def _catalog(self, client: SqlClient, name: str | None) -> tuple[list[Any], list[tuple[str, Sequence[str]]]]:
        assert isinstance(client, MySQLClient)
        where = "TABLE_SCHEMA = %s" + (" AND TABLE_NAME = %s" if name is not None else "")
        args = (self.schema, name) if name is not None else (self.schema,)
        columns = client.rows(
            "SELECT TABLE_NAME, COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS "
            f"WHERE {where} ORDER BY TABLE_NAME, ORDINAL_POSITION",
            "reading tables",
            args,
        )
        key_rows = client.rows(
            "SELECT TABLE_NAME, COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE "
            f"WHERE {where} AND CONSTRAINT_NAME = 'PRIMARY' ORDER BY TABLE_NAME, ORDINAL_POSITION",
            "reading tables",
            args,
        )
        keys: dict[str, list[str]] = {}
        for table, column in key_rows:
            keys.setdefault(table, []).append(column)
        return columns, list(keys.items())

    def _stage_tables(self, client: SqlClient) -> list[tuple[str, str]]:
        return client.rows(
            "SELECT TABLE_NAME, '' FROM information_schema.TABLES WHERE TABLE_SCHEMA = "
            f"{self.literal(self.schema)} AND LEFT(TABLE_NAME, {len(STAGE_PREFIX)}) = {self.literal(STAGE_PREFIX)}",
            "listing staging tables",
        )

    # --- patching -----------------------------------------------------------------------------

    def _column_def(self, column: str, sql_type: str, keys: Sequence[str]) -> str:
        return f"{quote(column)} {key_column_type(sql_type) if column in keys else sql_type}"

    def _table_options(self) -> str:
        return f" {self._options}"

    def _is_duplicate_column(self, exc: TerminalError) -> bool:
        cause = exc.__cause__
        return cause is not None and bool(cause.args) and cause.args[0] == DUPLICATE_COLUMN

    def _key_statements(self, client: SqlClient, table: str, keys: tuple[str, ...]) -> list[str]:
        current = self._read(table).get(table) or Table(table)
        changes = [
            f"MODIFY COLUMN {quote(k)} {KEY_TEXT_TYPE}"
            for k in keys
            if key_column_type(current.columns.get(k, "")) != current.columns.get(k, "")
        ]
        if current.primary_keys:
            changes.append("DROP PRIMARY KEY")
        changes.append(f"ADD PRIMARY KEY ({', '.join(quote(k) for k in keys)})")
        return [f"ALTER TABLE {self.name(table)} {', '.join(changes)}"]

    # --- batch --------------------------------------------------------------------------------

    def stage_target(self, job_id: str, pass_bytes: int = 0) -> MySQLStageTarget:
        self._connection()  # the database must exist before executors create tables in it
        return MySQLStageTarget(self.info, self.schema, job_id)

    def _value(self, column: str, stage: DataType | None, target_sql: str) -> str:
        if stage is None:
            return "NULL"
        if stage is DataType.BOOL and data_type_of(target_sql) is DataType.STRING:
            # As the other warehouses print booleans.
            return f"CASE WHEN {column} IS NULL THEN NULL WHEN {column} THEN 'true' ELSE 'false' END"
        return column

    # --- stream -------------------------------------------------------------------------------

    def _insert_rows(
        self, client: SqlClient, table: Table, columns: Sequence[str], rows: Sequence[Mapping[str, Any]], doing: str
    ) -> None:
        """Multi-row INSERTs of INSERT_ROWS rows, built here rather than by executemany, whose
        statement parsing a column name like `x) VALUES (` could confuse."""
        timestamps = [data_type_of(table.columns[c]) is DataType.TIMESTAMP for c in columns]
        try:
            values = [
                [
                    mysql_datetime(row.get(c)) if ts and row.get(c) is not None else row.get(c)
                    for c, ts in zip(columns, timestamps, strict=True)
                ]
                for row in rows
            ]
        except ValueError as exc:
            raise TerminalError(f"mysql: {doing}: {exc}") from exc
        names = ", ".join(quote(c) for c in columns)
        prefix = pct(f"INSERT INTO {self.name(table.name)} ({names}) VALUES ")
        suffix = pct(self._upsert(table, columns))
        marks = "(" + ", ".join(["%s"] * len(columns)) + ")"
        for start in range(0, len(values), INSERT_ROWS):
            part = values[start : start + INSERT_ROWS]
            client.execute(prefix + ", ".join([marks] * len(part)) + suffix, doing, [v for row in part for v in row])

    def recognize_users(
        self,
        table: Table,
        anonymous_column: str,
        user_columns: Sequence[str],
        pairs: Mapping[str, Sequence[Any]],
        unset: Sequence[str] = (),
    ) -> None:
        """`UPDATE ... JOIN` a derived table of the pairs as parameters, INSERT_ROWS pairs per
        statement, in one transaction (`docs/users-recognition.md`)."""
        first = "SELECT %s AS a" + "".join(f", %s AS u{i}" for i in range(len(user_columns)))
        more = "SELECT " + ", ".join(["%s"] * (len(user_columns) + 1))
        sets = ", ".join(pct(f"t.{quote(c)}") + f" = v.u{i}" for i, c in enumerate(user_columns))
        empty = " AND ".join(
            [pct(f"t.{quote(c)}") + " IS NULL" for c in user_columns]
            + ["COALESCE(" + pct(f"t.{quote(c)}") + ", '') = ''" for c in unset]
        )
        head = pct(f"UPDATE {self.name(table.name)} AS t JOIN (")
        tail = ") AS v ON " + pct(f"t.{quote(anonymous_column)}") + f" = v.a SET {sets} WHERE {empty}"
        items = [[anonymous_id, *values] for anonymous_id, values in pairs.items()]
        doing = f"recognizing {len(pairs)} users in {table.name!r}"
        with self._session() as client, client.transaction(doing):
            for start in range(0, len(items), INSERT_ROWS):
                part = items[start : start + INSERT_ROWS]
                derived = " UNION ALL ".join([first] + [more] * (len(part) - 1))
                client.execute(head + derived + tail, doing, [v for row in part for v in row])
