"""The broker raises the client's exception tree, so one tree serves both sides."""

from tidemq.errors import *  # noqa: F401,F403
from tidemq.errors import __all__  # noqa: F401
