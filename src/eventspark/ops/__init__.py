"""Operator features shared by the HTTP API and the CLI."""
