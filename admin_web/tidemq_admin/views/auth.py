"""Sign in and sign out."""

from __future__ import annotations


from datetime import timedelta

from flask import Blueprint, current_app, g, redirect, render_template, request, url_for

from tidemq import clock

from ..accounts import authenticate
from ..security import local_path, login_user, logout_user
from . import console

__all__ = ["bp"]

bp = Blueprint("auth", __name__)


def _safe_next(target: str) -> str:
    """Only local paths: never send a user to another site after signing in."""
    return local_path(target, url_for("dashboard.index"))


@bp.route("/login", methods=["GET", "POST"])
def login():  # type: ignore[no-untyped-def]
    c = console()
    no_users = not c.storage.console.users()
    if request.method == "GET":
        if g.user is not None:
            return redirect(url_for("dashboard.index"))
        return render_template("login.html", error=None, name="", no_users=no_users,
                               next=request.args.get("next", ""))
    name = (request.form.get("name") or "").strip()
    password = request.form.get("password") or ""
    address = request.remote_addr or "-"
    wait = c.throttle.reserve(name, address, clock.now())
    if wait > 0:
        error = f"Too many failed sign-ins. Try again in {wait:.0f} s."
        return render_template("login.html", error=error, name=name, no_users=no_users,
                               next=request.form.get("next", "")), 429
    user = authenticate(c.storage.console, name, password)
    if user is None:
        return render_template("login.html", error="Wrong user name or password.", name=name,
                               no_users=no_users, next=request.form.get("next", "")), 401
    c.throttle.succeeded(name, address)
    login_user(user.name)
    c.storage.sessions.sweep(clock.now(), current_app.config["TIDEMQ_SESSION_IDLE"],
                     current_app.config["TIDEMQ_SESSION_LIFETIME"], failures_kept=timedelta(days=1))
    return redirect(_safe_next(request.form.get("next", "")))


@bp.route("/logout", methods=["POST"])
def logout():  # type: ignore[no-untyped-def]
    logout_user()
    return redirect(url_for("auth.login"))
