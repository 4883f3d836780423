"""A safe interpreter for the subset of Go's ``text/template`` used by ``table_name_template``.

``lexer`` turns the source into tokens, ``compiler`` turns the tokens into Python closures,
``funcs`` holds the builtin functions and field access, ``gofmt`` Go's value printing and
``printf``, ``timefmt`` Go's reference-date layouts. Nothing here evaluates Python code or
looks up Python attributes named by the template: event data is reached only through
``dict.get`` and list indexing. The public entry point is ``eventspark.steps.template``.
"""
