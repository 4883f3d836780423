"""The files family: destinations that write rotated logs as objects to an object store (S3, GCS).

Each type (`destinations/s3/`, `destinations/gcs/`) is a short composition of what is here:

- `naming.py`: object names (`<folder>/<table>/<log>[.part-<offset>].<ext>[.gz]`) and the
  "dialect" that checks table names as path segments;
- `formats.py`: per format (`json`, `flat_json`, `csv`, `parquet`), the executor's buffer and the
  encoder of one object, gzip;
- `store.py`: the object store protocol the services implement (put, list, delete);
- `target.py`: the picklable `FilesTarget` executors write with, and `FilesDestination`, the
  driver's adapter (no tables: its commit only removes objects a rerun made stale).

Nothing here imports a driver: `boto3` and `google-cloud-storage` are imported by each type's
`client.py`, on the executor or driver that opens a store.
"""
