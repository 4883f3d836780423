"""DuckDB destination."""
