"""S3 has no SQL: its "dialect" is the files family's object naming (a table is a folder)."""

from eventspark.destinations.files.naming import OBJECT_NAMES

DIALECT = OBJECT_NAMES
