"""The two object stores behind one small interface, so each test runs against both."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.emulators.s3 import S3_KEY_ID, S3_REGION, S3_SECRET, s3_client
from tests.files.conftest import gcs_client


@dataclass
class S3Store:
    endpoint: str
    bucket: str
    type_name = "s3"

    def destination(
        self, fmt: str = "json", compression: str = "", folder: str = "", template: str = "events"
    ) -> dict[str, Any]:
        block = {
            "access_key_id": S3_KEY_ID,
            "secret_access_key": S3_SECRET,
            "bucket": self.bucket,
            "region": S3_REGION,
            "endpoint": self.endpoint,
            "folder": folder,
            "format": fmt,
        }
        if compression:
            block["compression"] = compression
        return {"type": "s3", "s3": block, "data_layout": {"table_name_template": template}}

    def objects(self) -> dict[str, bytes]:
        client = s3_client(self.endpoint)
        listed = client.list_objects_v2(Bucket=self.bucket).get("Contents", [])
        return {item["Key"]: client.get_object(Bucket=self.bucket, Key=item["Key"])["Body"].read() for item in listed}


@dataclass
class GcsStore:
    endpoint: str
    bucket: str
    type_name = "gcs"

    def destination(
        self, fmt: str = "json", compression: str = "", folder: str = "", template: str = "events"
    ) -> dict[str, Any]:
        # No key_file: anonymous credentials, as for any gcs_endpoint override.
        block = {"gcs_bucket": self.bucket, "gcs_endpoint": self.endpoint, "folder": folder, "format": fmt}
        if compression:
            block["compression"] = compression
        return {"type": "gcs", "google": block, "data_layout": {"table_name_template": template}}

    def objects(self) -> dict[str, bytes]:
        client = gcs_client(self.endpoint)
        return {blob.name: blob.download_as_bytes() for blob in client.list_blobs(self.bucket)}
