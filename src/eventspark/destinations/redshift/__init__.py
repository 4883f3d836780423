"""Amazon Redshift destination."""
