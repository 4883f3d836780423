"""MySQL destination."""
