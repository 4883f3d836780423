"""MySQL/MariaDB destination: its entry in the registry (`destinations.registry`)."""

from eventspark.destinations.base import DestinationType
from eventspark.destinations.mysql.capabilities import CAPABILITIES
from eventspark.destinations.mysql.configuration import MySQLDestination

DESTINATION = DestinationType(
    name="mysql",
    config=MySQLDestination,
    capabilities=CAPABILITIES,
    factory="eventspark.destinations.mysql.load:build",
    extra="mysql",
    driver="pymysql",
)
