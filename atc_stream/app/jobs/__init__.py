"""The work behind each ``atc-stream`` command, one module per command (``cli.py`` only
declares options and calls one function here).

A job function takes the command's option values and returns the exit status; what it
refuses and what it says go through ``app.console``.
"""
