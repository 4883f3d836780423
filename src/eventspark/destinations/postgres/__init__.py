"""PostgreSQL destination."""
