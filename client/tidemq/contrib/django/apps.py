"""The Django app: ``INSTALLED_APPS = [..., "tidemq.contrib.django"]``."""

from __future__ import annotations

from django.apps import AppConfig

__all__ = ["TidemqConfig"]


class TidemqConfig(AppConfig):
    """Registers the system checks of ``settings.TIDEMQ`` and brings the management commands
    (``tidemq_worker``, ``tidemq_db``). It has no models: tidemq's tables are created by
    ``manage.py tidemq_db init`` (``tidemq db init``), not by ``migrate``."""

    name = "tidemq.contrib.django"
    label = "tidemq"
    verbose_name = "tidemq"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers them)
