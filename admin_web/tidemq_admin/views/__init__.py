"""The console's pages, one blueprint per area."""

from __future__ import annotations

from flask import current_app

from ..console import Console

__all__ = ["console"]


def console() -> Console:
    """The app's shared Console."""
    return current_app.extensions["tidemq"]
