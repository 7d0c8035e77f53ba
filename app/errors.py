"""The root of every error the application raises on purpose.

Each module's own errors derive from ``ExportsError`` (a ``ConfigError`` for a setting, a ``StoreError``
for an impossible row count, a ``DestinationError`` for a destination that cannot be reached as
configured, a ``BuildFailed`` for a build, a ``CliError`` for an operator's input...), so a caller can
catch the application's errors apart from a library's or a bug.
"""


class ExportsError(Exception):
    """Base class of the application's own errors."""
