"""Snowflake destination."""
