"""bigquery emulator fixtures: filled in by the package that needs them."""
