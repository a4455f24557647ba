"""A small Django project using tidemq.contrib.django, as an application would.

The test passes the database and ZooKeeper through SHOP_* variables. Django's MySQL backend
runs on PyMySQL here (``install_as_MySQLdb``): mysqlclient, Django's default driver, needs C
headers to build; tidemq speaks to either through Django's cursor.
"""

import json
import os

import pymysql

pymysql.install_as_MySQLdb()

SECRET_KEY = "test-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "shop_site.urls"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django.contrib.contenttypes", "tidemq.contrib.django", "shop"]
MIDDLEWARE: list = []
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.mysql",
        "NAME": os.environ["SHOP_DB_NAME"],
        "USER": "root",
        "HOST": "127.0.0.1",
        "PORT": os.environ["SHOP_DB_PORT"],
        "OPTIONS": {"charset": "utf8mb4"},
    }
}
TIDEMQ = {"ZK_HOSTS": os.environ["SHOP_ZK_HOSTS"], "RPC_TIMEOUT": 10}
if os.environ.get("SHOP_TIDEMQ_DATABASE"):  # tidemq's tables in this database: enqueue, not produce
    TIDEMQ["DATABASE"] = os.environ["SHOP_TIDEMQ_DATABASE"]
TIDEMQ.update(json.loads(os.environ.get("SHOP_TIDEMQ_EXTRA", "{}")))  # what the checks test sets wrong
LOGGING = {"version": 1, "handlers": {"console": {"class": "logging.StreamHandler"}},
           "root": {"handlers": ["console"], "level": "INFO"}}
