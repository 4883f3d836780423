import duckdb
import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventspark.destinations.dialect import DIALECT_NAMES, Dialect, get_dialect
from eventspark.steps.flatten import MAX_NAME_LENGTH
from eventspark.steps.typing import DataType, Field

# The type table of eventnative-reference.md, column order BOOL INT64 FLOAT64 STRING TIMESTAMP.
REFERENCE_TYPES = {
    "postgres": ("boolean", "bigint", "numeric(38,18)", "text", "timestamp"),
    "redshift": ("boolean", "bigint", "numeric(38,18)", "character varying(65535)", "timestamp"),
    "bigquery": ("BOOLEAN", "INTEGER", "FLOAT", "STRING", "TIMESTAMP"),
    "clickhouse": ("UInt8", "Int64", "Float64", "String", "DateTime"),
    "snowflake": ("boolean", "bigint", "numeric(38,18)", "text", "timestamp(6)"),
    "mysql": ("BOOLEAN", "BIGINT", "DECIMAL(38,18)", "TEXT", "DATETIME"),
}
ORDER = (DataType.BOOL, DataType.INT64, DataType.FLOAT64, DataType.STRING, DataType.TIMESTAMP)

dialects = [get_dialect(name) for name in DIALECT_NAMES]
identifiers = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="".join(map(chr, range(32))) + "\x7f"),
    min_size=1,
    max_size=20,
)


def unquote(dialect: Dialect, quoted: str) -> str:
    """Read one quoted identifier the way the warehouse's lexer would; it must use all of ``quoted``."""
    q = dialect.quote_char
    assert quoted[0] == q
    out, i = [], 1
    while True:
        char = quoted[i]
        if dialect.quote_escape == "backslash" and char == "\\":
            out.append(quoted[i + 1])
            i += 2
        elif char == q and dialect.quote_escape == "double" and quoted[i + 1 : i + 2] == q:
            out.append(q)
            i += 2
        elif char == q:
            assert i == len(quoted) - 1, "the identifier ends before the quoted text does"
            return "".join(out)
        else:
            out.append(char)
            i += 1


@pytest.mark.parametrize("name", sorted(REFERENCE_TYPES))
def test_types_match_the_reference_table(name: str) -> None:
    dialect = get_dialect(name)
    assert tuple(dialect.types[t] for t in ORDER) == REFERENCE_TYPES[name]


@pytest.mark.parametrize("dialect", dialects, ids=DIALECT_NAMES)
def test_every_dialect_is_complete_and_fits_flattened_names(dialect: Dialect) -> None:
    assert set(dialect.types) == set(DataType)
    assert dialect.max_identifier_length is None or dialect.max_identifier_length >= MAX_NAME_LENGTH


@pytest.mark.parametrize("dialect", dialects, ids=DIALECT_NAMES)
def test_column_type(dialect: Dialect) -> None:
    assert dialect.column_type(Field(DataType.INT64)) == dialect.types[DataType.INT64]
    assert dialect.column_type(Field(DataType.INT64, "numeric(12,2)")) == "numeric(12,2)"
    assert dialect.column_type(Field(DataType.STRING, "Timestamp")) == dialect.types[DataType.TIMESTAMP]


@pytest.mark.parametrize(
    ("name", "identifier", "quoted"),
    [
        ("postgres", 'a"b', '"a""b"'),
        ("mysql", "a`b", "`a``b`"),
        ("bigquery", "a`b\\c", "`a\\`b\\\\c`"),
        ("clickhouse", "a`b", "`a\\`b`"),
        ("snowflake", "events", '"events"'),
    ],
)
def test_quote_examples(name: str, identifier: str, quoted: str) -> None:
    assert get_dialect(name).quote(identifier) == quoted


@pytest.mark.parametrize("dialect", dialects, ids=DIALECT_NAMES)
@given(identifier=identifiers)
def test_quote_cannot_be_escaped(dialect: Dialect, identifier: str) -> None:
    quoted = dialect.quote(identifier)
    assert unquote(dialect, quoted) == identifier


@pytest.mark.parametrize("dialect", dialects, ids=DIALECT_NAMES)
@pytest.mark.parametrize("bad", ["", "a\x00b", "line\nbreak", "\ud800"])
def test_quote_refuses_unsafe_identifiers(dialect: Dialect, bad: str) -> None:
    with pytest.raises(ValueError):
        dialect.quote(bad)


def test_quote_refuses_names_the_warehouse_would_truncate() -> None:
    postgres = get_dialect("postgres")
    assert postgres.quote("x" * 63)
    with pytest.raises(ValueError, match="64 bytes; postgres allows 63"):
        postgres.quote("x" * 64)
    with pytest.raises(ValueError):
        postgres.quote("é" * 32)  # 64 bytes in UTF-8


def test_get_dialect_refuses_unknown_names() -> None:
    with pytest.raises(ValueError, match="unknown destination type"):
        get_dialect("../postgres")


def test_dialect_validates_itself() -> None:
    with pytest.raises(ValueError, match="no SQL type for"):
        Dialect("half", {DataType.BOOL: "boolean"})
    with pytest.raises(ValueError, match="quote_char"):
        Dialect("q", {t: "text" for t in DataType}, quote_char="''")


def test_duckdb_accepts_its_types_and_quoted_names() -> None:
    dialect = get_dialect("duckdb")
    names = {t: f'col "{t.name}" `x`' for t in DataType}
    columns = ", ".join(f"{dialect.quote(names[t])} {dialect.column_type(Field(t))}" for t in DataType)
    table = dialect.quote('weird "table')
    with duckdb.connect() as con:
        con.execute(f"CREATE TABLE {table} ({columns})")
        described = con.execute(f"DESCRIBE {table}").fetchall()
    assert [row[0] for row in described] == list(names.values())
    assert [row[1] for row in described] == [
        {"TIMESTAMPTZ": "TIMESTAMP WITH TIME ZONE"}.get(sql, sql) for sql in (dialect.types[t] for t in DataType)
    ]


def test_mysql_counts_characters_and_postgres_bytes() -> None:
    accented = "é" * 40  # 80 UTF-8 bytes
    assert get_dialect("mysql").quote(accented) == f"`{accented}`"
    with pytest.raises(ValueError, match="is 65 characters; mysql allows 64"):
        get_dialect("mysql").quote("x" * 65)
    with pytest.raises(ValueError, match="is 80 bytes; postgres allows 63"):
        get_dialect("postgres").quote(accented)
