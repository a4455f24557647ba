"""``python manage.py tidemq_worker``: ``tidemq worker`` for a Django project.

It imports every installed app's ``consumers.py`` (and any modules named on the command line),
then runs their consumers with the options, signal handling and drain of ``tidemq worker``
(``tidemq.worker_command``: the same code). Settings come from ``settings.TIDEMQ``.

Each run of a ``def`` handler starts and ends with ``django.db.close_old_connections()``, as a
request does, so a handler thread never works on a connection the server dropped or one older
than ``CONN_MAX_AGE``. ``async def`` handlers use Django's async ORM, which manages its own.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections
from django.utils.module_loading import autodiscover_modules

from tidemq.consumer import ConsumerSpec, registered_consumers
from tidemq.errors import TidemqError
from tidemq.worker_command import add_worker_options, run_worker

from ...conf import tidemq_settings


class Command(BaseCommand):
    help = "Run the tidemq consumers declared in installed apps' consumers.py until SIGTERM/SIGINT, then drain."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("modules", nargs="*", help="more modules declaring consumers, e.g. myapp.jobs")
        add_worker_options(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            settings = tidemq_settings(metrics_port=options["metrics_port"])
            autodiscover_modules("consumers")
            for module in options["modules"]:
                importlib.import_module(module)
            specs = [_with_fresh_connections(spec) for spec in registered_consumers()]
            if not specs:
                raise CommandError("no consumers: declare them with @tidemq.mq_consumer in an installed app's "
                                   "consumers.py (or name their modules)")
            code = run_worker(settings, drain_timeout=options["drain_timeout"], concurrency=options["concurrency"],
                              max_idle=options["max_idle"], specs=specs)
        except TidemqError as exc:
            raise CommandError(str(exc)) from None
        if code:
            sys.exit(code)


def _with_fresh_connections(spec: ConsumerSpec) -> ConsumerSpec:
    if spec.is_async:
        return spec
    handler = spec.handler

    @functools.wraps(handler)
    def run(message: Any) -> Any:
        close_old_connections()
        try:
            return handler(message)
        finally:
            close_old_connections()

    return dataclasses.replace(spec, handler=run)
