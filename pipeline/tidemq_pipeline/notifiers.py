"""Where raised alarms are sent: the log (always), and SMTP or a webhook when configured."""

from __future__ import annotations

import json
import logging
import smtplib
import urllib.request
from dataclasses import asdict, dataclass
from datetime import datetime
from email.message import EmailMessage
from typing import Optional, Sequence

from tidemq.errors import ConfigurationError

__all__ = ["Alarm", "Notifier", "LogNotifier", "WebhookNotifier", "SmtpNotifier", "build_notifiers"]

log = logging.getLogger("tidemq.pipeline.alarm")


@dataclass(frozen=True)
class Alarm:
    """One alarm as stored in tidemq_alarm and sent to the notifiers."""

    id: int
    topic: str
    kind: str
    value: float
    threshold: float
    message: str
    raised_at: datetime

    def to_json(self) -> dict:
        data = asdict(self)
        data["raised_at"] = self.raised_at.isoformat() + "Z"
        return data


class Notifier:
    """Sends alarms somewhere; a failing notifier is logged and does not stop the others."""

    name = "notifier"

    def send(self, alarms: Sequence[Alarm]) -> None:
        raise NotImplementedError


class LogNotifier(Notifier):
    name = "log"

    def send(self, alarms: Sequence[Alarm]) -> None:
        for alarm in alarms:
            log.warning("ALARM %s %s: %s", alarm.topic, alarm.kind, alarm.message)


class WebhookNotifier(Notifier):
    """POSTs ``{"alarms": [...]}`` as JSON to a URL (Slack-style incoming hooks, alert managers)."""

    name = "webhook"

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigurationError(f"--webhook must be an http:// or https:// URL, got {url!r}")
        self.url, self.timeout = url, timeout

    def send(self, alarms: Sequence[Alarm]) -> None:
        body = json.dumps({"alarms": [a.to_json() for a in alarms]}).encode()
        request = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"},
                                         method="POST")
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            response.read()


class SmtpNotifier(Notifier):
    """One mail per run listing the alarms raised."""

    name = "smtp"

    def __init__(self, server: str, sender: str, recipients: Sequence[str], timeout: float = 10.0) -> None:
        host, _, port = server.partition(":")
        if not host or not recipients or not sender:
            raise ConfigurationError("--smtp HOST[:PORT] needs --mail-from and at least one --mail-to")
        self.host, self.port = host, int(port or 25)
        self.sender, self.recipients, self.timeout = sender, list(recipients), timeout

    def send(self, alarms: Sequence[Alarm]) -> None:
        mail = EmailMessage()
        mail["Subject"] = f"tidemq: {len(alarms)} alarm(s) raised"
        mail["From"], mail["To"] = self.sender, ", ".join(self.recipients)
        mail.set_content("\n".join(f"{a.raised_at:%Y-%m-%d %H:%M:%S} UTC  {a.topic}  {a.kind}: {a.message}"
                                   for a in alarms))
        with smtplib.SMTP(self.host, self.port, timeout=self.timeout) as smtp:
            smtp.send_message(mail)


def build_notifiers(webhook: Optional[str] = None, smtp: Optional[str] = None, mail_from: Optional[str] = None,
                    mail_to: Sequence[str] = ()) -> list[Notifier]:
    """The log, plus a webhook and/or SMTP when given."""
    notifiers: list[Notifier] = [LogNotifier()]
    if webhook:
        notifiers.append(WebhookNotifier(webhook))
    if smtp:
        notifiers.append(SmtpNotifier(smtp, mail_from or "", mail_to))
    return notifiers
