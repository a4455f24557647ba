"""The tidemq admin console: a Flask app over the broker's storage layer and the coordinator."""

from .app import create_app

__all__ = ["create_app"]
