"""Every statement that can give an export an outcome (a terminal status, or OutcomeUnknown) inserts its
webhook deliveries itself, in the same statement, from the rows its update returned: a writer added
later without them fails here before any behaviour test notices."""

from __future__ import annotations

import re

from app.store.statements import STATEMENTS

#: The statuses a job is still on its way in; setting any other is an outcome.
_LIVE = {"'Queued'", "'Running'", "'Delivering'"}
_SETS_STATUS = re.compile(r"UPDATE export_jobs\b.*?\bSET status = (?P<value>'\w+'|%\(\w+\)s)", re.DOTALL)
_WEBHOOK = re.compile(r"webhook AS \(\s*INSERT INTO webhook_deliveries .*?FROM (?P<cte>\w+) \w+ JOIN webhook_endpoints "
                      r"w ON w\.tenant_id = \w+\.tenant_id AND w\.removed_at IS NULL\)", re.DOTALL)


def outcome_statements() -> dict[str, str]:
    found = {}
    for name, text in STATEMENTS.items():
        values = {m["value"] for m in _SETS_STATUS.finditer(text)}
        if values - _LIVE:
            found[name] = text
    return found


def test_the_outcome_writers_are_the_ones_the_protocol_names():
    assert sorted(outcome_statements()) == [
        "cancellation_cancel_queued", "export_correct", "export_finish_delivery", "export_finish_failed",
        "export_finish_stopped", "export_reconcile", "export_reject", "recovery_exhaust_expired",
        "recovery_resolve_delivering", "recovery_stop_expired"]


def test_every_outcome_writer_tells_the_tenant_s_live_endpoints_from_the_rows_it_changed():
    missing = []
    for name, text in outcome_statements().items():
        hook = _WEBHOOK.search(text)
        changed = re.search(r"\b(\w+) AS \(\s*UPDATE export_jobs", text)
        if hook is None or changed is None or hook["cte"] != changed.group(1):
            missing.append(name)

    assert missing == []


def test_no_statement_that_keeps_a_job_on_its_way_tells_a_webhook():
    live = [name for name, text in STATEMENTS.items()
            if "INSERT INTO webhook_deliveries" in text and name not in outcome_statements()]

    assert live == []
