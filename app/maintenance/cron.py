"""A schedule's fire times, as APScheduler 3's cron trigger computes them in the schedule's time zone.

``CronTrigger.from_crontab(expr, timezone=ZoneInfo(zone))`` decides every fire time, DST included: a
local time that does not exist when clocks go forward fires at the instant they jump (02:00 on the last
Sunday of March in Europe/Berlin fires at 03:00 CEST), and one that occurs twice when they go back is
computed twice. A fire's *slot* is the local wall-clock time of its instant, and the database keeps one
run per slot, so that second 02:00 is the same slot and never runs again.

Two deliberate departures from a bare ``from_crontab``: a sixth, leading field of seconds is accepted
(``*/5 * * * * *``: every five seconds, for soaks and demos), and a numeric day of week is refused,
because APScheduler counts 0 as Monday where cron counts it as Sunday: names (``mon-fri``) mean the same
to both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.cron import CronTrigger

from app.errors import ExportsError

#: Longest expression and zone name accepted (the schema's CHECKs allow these).
MAX_EXPRESSION = 200
MAX_ZONE = 100
_DIGIT = re.compile(r"\d")
_STEP = timedelta(microseconds=1)


class CronError(ExportsError, ValueError):
    """Raised when a cron expression or a time zone cannot be used; the message says why. Also a
    ``ValueError``, which is what a bad value is."""


@dataclass(frozen=True)
class Cron:
    expression: str
    time_zone: str
    trigger: CronTrigger = field(repr=False, compare=False)

    @classmethod
    def parse(cls, expression: str, time_zone: str) -> Cron:
        if not 1 <= len(time_zone) <= MAX_ZONE:
            raise CronError(f"a time zone name has 1 to {MAX_ZONE} characters")
        try:
            zone = ZoneInfo(time_zone)
        except (ZoneInfoNotFoundError, ValueError):
            raise CronError(f"unknown time zone {time_zone!r} (an IANA name, such as Europe/Berlin)") from None
        fields = expression.split()
        if len(expression) > MAX_EXPRESSION or len(fields) not in (5, 6):
            raise CronError("a cron expression has five fields (minute hour day month day-of-week), or six with "
                            "seconds first")
        if _DIGIT.search(fields[-1]):
            raise CronError("name the days of the week (mon-fri, sun): APScheduler counts 0 as Monday, cron as "
                            "Sunday")
        try:
            if len(fields) == 5:
                trigger = CronTrigger.from_crontab(" ".join(fields), timezone=zone)
            else:
                second, minute, hour, day, month, day_of_week = fields
                trigger = CronTrigger(second=second, minute=minute, hour=hour, day=day, month=month,
                                      day_of_week=day_of_week, timezone=zone)
        except ValueError as exc:
            raise CronError(f"not a cron expression APScheduler accepts: {exc}") from None
        return cls(" ".join(fields), time_zone, trigger)

    def first_at_or_after(self, instant: datetime) -> datetime | None:
        """The first fire time at or after ``instant`` (UTC), or None when it never fires again."""
        fire = self.trigger.get_next_fire_time(None, instant.astimezone(self.trigger.timezone))
        return None if fire is None else fire

    def after(self, fire: datetime) -> datetime | None:
        """The fire time after ``fire``. Asked from the next instant, never from the previous fire: given a
        previous fire on the second 02:00 of a night the clocks go back, APScheduler answers that same
        fire again."""
        return self.first_at_or_after(fire.astimezone(UTC) + _STEP)

    def slot(self, fire: datetime) -> datetime:
        """A fire's slot: the local wall-clock time of its instant in the schedule's zone (naive). Both
        02:00s of a night the clocks go back are the slot 02:00; a fire at the instant they jump forward
        is the slot after the jump (03:00)."""
        return fire.astimezone(UTC).astimezone(self.trigger.timezone).replace(tzinfo=None)

    def upcoming(self, instant: datetime, count: int) -> list[datetime]:
        fires: list[datetime] = []
        fire = self.first_at_or_after(instant)
        while fire is not None and len(fires) < count:
            fires.append(fire)
            fire = self.after(fire)
        return fires
