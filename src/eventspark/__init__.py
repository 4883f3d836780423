"""eventspark: self-hosted event collection on Apache Spark."""

__version__ = "0.1.0"
