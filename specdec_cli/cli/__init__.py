"""The command line: main.py holds the app and the one error boundary; a module per command beside it."""

from .main import app, main, run

__all__ = ["app", "main", "run"]
