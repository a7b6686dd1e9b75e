"""The package version, in one place (pyproject.toml reads it)."""

__version__ = "0.3.0"
