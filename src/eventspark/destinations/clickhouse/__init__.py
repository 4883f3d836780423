"""ClickHouse destination."""
