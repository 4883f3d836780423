"""Google BigQuery destination."""
