"""``settings.TIDEMQ``: tidemq's settings in a Django project, read and checked in one place.

``TIDEMQ`` is a dict whose keys are the names of the ``TIDEMQ_*`` environment variables without
the prefix (``ZK_HOSTS``, ``BROKERS``, ``TOKEN``...), plus ``DATABASE``: the alias of the Django
database that holds tidemq's tables, which makes :func:`tidemq.contrib.django.enqueue` write
messages in that connection's transactions. A key that is absent falls back to the environment,
as for any tidemq process, so a secret can stay in ``TIDEMQ_TOKEN``.
"""

from __future__ import annotations

import difflib
import os
import re
from typing import Any, Optional

from tidemq.config import Settings
from tidemq.errors import ConfigurationError

__all__ = ["KEYS", "raw", "problems", "tidemq_settings", "database_alias", "MYSQL_ENGINES"]

#: TIDEMQ key -> (Settings field, accepted types). What a client and a worker read; the broker's
#: own settings (the database URL, TLS client CA, authentication mode) are the brokers' to set.
KEYS: dict[str, tuple[str, tuple[type, ...]]] = {
    "ZK_HOSTS": ("zk_hosts", (str,)),
    "ZK_ROOT": ("zk_root", (str,)),
    "ZK_AUTH": ("zk_auth", (str,)),
    "ZK_SESSION_TIMEOUT": ("zk_session_timeout", (int, float)),
    "BROKERS": ("brokers", (str, list, tuple)),
    "RPC_TIMEOUT": ("rpc_timeout", (int, float)),
    "PRODUCE_IN_FLIGHT": ("produce_in_flight", (int,)),
    "TOKEN": ("token", (str,)),
    "TLS_CA": ("tls_ca", (str,)),
    "TLS_CERT": ("tls_cert", (str,)),
    "TLS_KEY": ("tls_key", (str,)),
    "METRICS_PORT": ("metrics_port", (int,)),
    "METRICS_HOST": ("metrics_host", (str,)),
}
DATABASE = "DATABASE"
#: Django database engines that can hold tidemq's tables (enqueue writes MySQL statements).
MYSQL_ENGINES = ("django.db.backends.mysql",)


def raw() -> dict[str, Any]:
    """``settings.TIDEMQ`` as given (an empty dict when absent)."""
    from django.conf import settings

    value = getattr(settings, "TIDEMQ", {})
    return value if isinstance(value, dict) else {"__not_a_dict__": value}


def problems() -> list[tuple[str, str]]:
    """What is wrong with ``settings.TIDEMQ``: (key, message naming it and the expected form)."""
    from django.conf import settings

    given = raw()
    if "__not_a_dict__" in given:
        return [("", "settings.TIDEMQ must be a dict of tidemq settings, "
                     f"got {type(given['__not_a_dict__']).__name__}")]
    found: list[tuple[str, str]] = []
    for key, value in given.items():
        if key == DATABASE:
            continue
        if key not in KEYS:
            close = difflib.get_close_matches(str(key), [*KEYS, DATABASE], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join([DATABASE, *KEYS])}"
            found.append((key, f"TIDEMQ[{key!r}] is not a tidemq setting{hint}"))
            continue
        types = KEYS[key][1]
        if isinstance(value, bool) or not isinstance(value, types):
            found.append((key, f"TIDEMQ[{key!r}] must be {' or '.join(t.__name__ for t in types)}, "
                               f"got {type(value).__name__}"))
        elif key == "BROKERS" and not isinstance(value, str) and not all(isinstance(v, str) for v in value):
            found.append((key, f"TIDEMQ['BROKERS'] lists host:port strings, got {value!r}"))
    alias = given.get(DATABASE)
    if alias is not None:
        if alias not in settings.DATABASES:
            found.append((DATABASE, f"TIDEMQ['DATABASE'] names {alias!r}, which is not in settings.DATABASES "
                                    f"({', '.join(settings.DATABASES) or 'none'})"))
        elif settings.DATABASES[alias].get("ENGINE") not in MYSQL_ENGINES:
            found.append((DATABASE, f"TIDEMQ['DATABASE']: tidemq's tables live in MySQL/MariaDB "
                                    f"({MYSQL_ENGINES[0]}); database {alias!r} uses "
                                    f"{settings.DATABASES[alias].get('ENGINE')}"))
    if not found:
        try:
            tidemq_settings()
        except ConfigurationError as exc:
            found.append(("", _in_django_terms(str(exc))))
    return found


def tidemq_settings(**overrides: Any) -> Settings:
    """tidemq's :class:`~tidemq.Settings`: the environment, then ``settings.TIDEMQ``, then
    ``overrides`` (non-None values, e.g. a command's ``--metrics-port``)."""
    values = {field: raw()[key] for key, (field, _) in KEYS.items() if key in raw()}
    if isinstance(values.get("brokers"), (list, tuple)):
        values["brokers"] = ",".join(values["brokers"])
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return Settings.from_env(os.environ, **values)
    except ConfigurationError as exc:
        raise ConfigurationError(_in_django_terms(str(exc))) from None


def database_alias() -> Optional[str]:
    """The alias of the Django database holding tidemq's tables (``TIDEMQ['DATABASE']``), or None."""
    return raw().get(DATABASE)


def _in_django_terms(message: str) -> str:
    """A Settings error names the environment variable; name the TIDEMQ key where one was given."""
    for key in KEYS:
        if key in raw():
            message = re.sub(rf"\bTIDEMQ_{key}\b", f"TIDEMQ[{key!r}]", message)
    return message
