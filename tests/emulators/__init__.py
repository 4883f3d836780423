"""Local emulators of cloud services, started by the tests on loopback (../shared/emulators.md says
which work here, with versions and quirks). Each module is a pytest plugin (tests/conftest.py lists
them) giving session fixtures; the real client libraries talk to them."""
