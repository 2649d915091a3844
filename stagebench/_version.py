"""The package version: one source, importable from any layer without the package's API."""

__version__ = "0.1.0"
