"""exports: queued CRM contact exports to partner SFTP servers, with safe cancellation and recovery."""

from importlib import metadata

try:
    __version__ = metadata.version("exports")
except metadata.PackageNotFoundError:   # run from a source tree that was never installed
    __version__ = "0+unknown"
