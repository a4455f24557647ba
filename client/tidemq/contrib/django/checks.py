"""System checks (``manage.py check``): ``settings.TIDEMQ`` and, with ``--database``, the tables."""

from __future__ import annotations

from typing import Any

from django.core.checks import Error, Tags, Warning, register

from tidemq import tables

from . import conf

__all__ = ["check_settings", "check_tables"]


@register("tidemq")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """Every wrong key or value of ``settings.TIDEMQ`` is an error that names it; a project with
    neither brokers nor a database to reach gets a warning."""
    found = [Error(message, hint=None, obj="settings.TIDEMQ" + (f"[{key!r}]" if key else ""), id="tidemq.E001")
             for key, message in conf.problems()]
    if not found:
        settings = conf.tidemq_settings()
        if not (settings.zk_hosts or settings.brokers or conf.database_alias()):
            found.append(Warning("tidemq has no brokers to reach and no database to enqueue in",
                                 hint="set TIDEMQ['ZK_HOSTS'] (or ['BROKERS']), and TIDEMQ['DATABASE'] when "
                                      "tidemq's tables are in one of this project's databases",
                                 obj="settings.TIDEMQ", id="tidemq.W001"))
    return found


@register(Tags.database)
def check_tables(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[Any]:
    """With ``manage.py check --database ALIAS`` (and before ``migrate``): tidemq's tables are in
    ``TIDEMQ['DATABASE']``. Django runs database checks only when asked, as they connect. A
    warning, not an error: an error would stop ``migrate``, which a new project runs first."""
    from django.db import connections

    alias = conf.database_alias()
    if not databases or alias is None or alias not in databases or conf.problems():
        return []
    present = set(connections[alias].introspection.table_names())
    if tables.MESSAGE.name in present:
        return []
    return [Warning(f"tidemq's tables are not in database {alias!r} (TIDEMQ['DATABASE'])",
                  hint=f"create them with: python manage.py tidemq_db init (or tidemq db init with "
                       f"TIDEMQ_DB_URL naming database {alias!r})",
                  obj="settings.TIDEMQ['DATABASE']", id="tidemq.W002")]
