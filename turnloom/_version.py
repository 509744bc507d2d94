"""The package's version, written once: ``turnloom.__version__`` and the wheel read it."""

__version__ = "0.1.0"
