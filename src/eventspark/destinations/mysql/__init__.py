"""MySQL/MariaDB destination: its entry in the registry (`destinations.registry`)."""

from eventspark.destinations.base import DestinationType
from eventspark.destinations.mysql.capabilities import CAPABILITIES
from eventspark.destinations.mysql.configuration import MySQLDestination
from eventspark.destinations.mysql.dialect import DIALECT

DESTINATION = DestinationType(
    name="mysql",
    config=MySQLDestination,
    capabilities=CAPABILITIES,
    dialect=DIALECT,
    factory="eventspark.destinations.mysql.load:build",
    extra="mysql",
    driver="pymysql",
)
