"""Amazon Redshift: not a registered destination type yet (config and serve refuse `type: redshift`).

Only its dialect exists (types as in EventNative's table, quoting), checked by
tests/destinations/test_dialects.py; the package gets the other files of docs/destinations/adding.md
and its registry entry when it is built (issue 14).
"""
