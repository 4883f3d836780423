"""What a webhook can do: the HTTP family's capabilities (stream mode, events not rows)."""

from eventspark.destinations.http import http_capabilities

CAPABILITIES = http_capabilities()
