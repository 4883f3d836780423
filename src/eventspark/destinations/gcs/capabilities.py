"""What GCS can do: the files family's capabilities (batch mode, objects written by executors)."""

from eventspark.destinations.files.capabilities import FILES_CAPABILITIES

CAPABILITIES = FILES_CAPABILITIES
