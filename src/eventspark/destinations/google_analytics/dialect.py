"""No SQL: the HTTP family's dialect (table names only filter events)."""

from eventspark.destinations.http import http_dialect

DIALECT = http_dialect("google_analytics")
