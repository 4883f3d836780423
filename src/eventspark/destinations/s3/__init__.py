"""Amazon S3 (and S3-compatible stores) files destination: its entry in the registry."""

from eventspark.destinations.base import DestinationType
from eventspark.destinations.s3.capabilities import CAPABILITIES
from eventspark.destinations.s3.configuration import S3Destination
from eventspark.destinations.s3.dialect import DIALECT

DESTINATION = DestinationType(
    name="s3",
    config=S3Destination,
    capabilities=CAPABILITIES,
    dialect=DIALECT,
    factory="eventspark.destinations.s3.load:build",
    probe="eventspark.destinations.files.probe:probe",
    extra="s3",
    driver="boto3",
)
