"""Peewee models, for reads only: every write goes through a named statement in app/store/sql/.

The models are bound to no database: ``app.store.views`` binds each of its queries to a read-only
database of its own, so nothing reads through a connection set up elsewhere. The models' field order
matches the table's column order, and a test compares the cancellation lock's column list with it.
"""

from __future__ import annotations

import peewee


class Tenant(peewee.Model):
    id = peewee.UUIDField(primary_key=True)
    name = peewee.TextField()
    created_at = peewee.DateTimeField()
    paused_by = peewee.TextField(null=True)
    paused_at = peewee.DateTimeField(null=True)

    class Meta:
        table_name = "tenants"


class Destination(peewee.Model):
    id = peewee.UUIDField(primary_key=True)
    tenant_id = peewee.UUIDField()
    name = peewee.TextField()
    host = peewee.TextField()
    port = peewee.IntegerField()
    username = peewee.TextField()
    remote_dir = peewee.TextField()
    host_key = peewee.TextField()
    credential_ref = peewee.TextField()
    remote_hash = peewee.BooleanField()
    acknowledgments = peewee.BooleanField()
    name_and_size_identify = peewee.BooleanField()
    read_back = peewee.BooleanField()
    active = peewee.BooleanField()
    created_at = peewee.DateTimeField()
    max_sessions = peewee.IntegerField()
    auto_retries = peewee.IntegerField()
    profile_version = peewee.IntegerField()
    file_sequence = peewee.BigIntegerField()
    more_host_keys = peewee.TextField()   # text[]; read through app.store.directory
    delivery_mode = peewee.TextField()
    bandwidth_limit = peewee.BigIntegerField(null=True)
    pause_state = peewee.TextField(null=True)
    paused_by = peewee.TextField(null=True)
    paused_at = peewee.DateTimeField(null=True)

    class Meta:
        table_name = "destinations"


class DeliveryProfile(peewee.Model):
    destination_id = peewee.UUIDField()
    version = peewee.IntegerField()
    profile = peewee.TextField()   # jsonb; read through app.store.directory, which decodes it
    created_by = peewee.TextField()
    created_at = peewee.DateTimeField()

    class Meta:
        table_name = "delivery_profiles"
        primary_key = peewee.CompositeKey("destination_id", "version")


class Contact(peewee.Model):
    id = peewee.BigIntegerField(primary_key=True)
    tenant_id = peewee.UUIDField()
    email = peewee.TextField()
    full_name = peewee.TextField()
    company = peewee.TextField(null=True)
    phone = peewee.TextField(null=True)
    consent = peewee.BooleanField()
    updated_at = peewee.DateTimeField()
    consent_withdrawn_at = peewee.DateTimeField(null=True)

    class Meta:
        table_name = "contacts"


class OperatorAccess(peewee.Model):
    id = peewee.BigIntegerField(primary_key=True)
    operator_id = peewee.TextField()
    tenant_id = peewee.UUIDField()
    reconciliation = peewee.BooleanField()
    granted_at = peewee.DateTimeField()
    revoked_by = peewee.TextField(null=True)
    revoked_at = peewee.DateTimeField(null=True)

    class Meta:
        table_name = "operator_access"


class ExportJob(peewee.Model):
    id = peewee.UUIDField(primary_key=True)
    tenant_id = peewee.UUIDField()
    status = peewee.TextField()
    version = peewee.IntegerField()
    destination_id = peewee.UUIDField()
    attempt_id = peewee.UUIDField(null=True)
    attempt_count = peewee.IntegerField()
    claimed_by = peewee.TextField(null=True)
    lease_expires_at = peewee.DateTimeField(null=True)
    stop_request_id = peewee.UUIDField(null=True)
    cancellation_request_id = peewee.UUIDField(null=True)
    expected_file_name = peewee.TextField(null=True)
    expected_file_bytes = peewee.BigIntegerField(null=True)
    expected_file_sha256 = peewee.BlobField(null=True)
    delivery_authorized_at = peewee.DateTimeField(null=True)
    woken_at = peewee.DateTimeField()
    failure_reason = peewee.TextField(null=True)
    delivery_key = peewee.TextField()
    replaces_job_id = peewee.UUIDField(null=True)
    created_by = peewee.TextField()
    replacement_reason = peewee.TextField(null=True)
    overwrite_agreement_ref = peewee.TextField(null=True)
    sweep_count = peewee.IntegerField()
    created_at = peewee.DateTimeField()
    deferrals = peewee.IntegerField()
    deferred_since = peewee.DateTimeField(null=True)
    last_deferral = peewee.TextField(null=True)
    expected_profile_version = peewee.IntegerField(null=True)
    expected_marker_name = peewee.TextField(null=True)
    expected_marker = peewee.BlobField(null=True)
    schedule_id = peewee.UUIDField(null=True)
    schedule_slot = peewee.DateTimeField(null=True)   # the slot's local wall-clock time in its schedule's zone
    incremental = peewee.BooleanField()
    incremental_since = peewee.TextField(null=True)   # pg_snapshot, read as its text
    expected_snapshot = peewee.TextField(null=True)   # pg_snapshot, read as its text
    expected_delivery_mode = peewee.TextField(null=True)

    class Meta:
        table_name = "export_jobs"


class Delivery(peewee.Model):
    tenant_id = peewee.UUIDField()
    delivery_key = peewee.TextField()
    original_job_id = peewee.UUIDField()
    file_name = peewee.TextField()

    class Meta:
        table_name = "deliveries"
        primary_key = peewee.CompositeKey("tenant_id", "delivery_key")


class AttemptEvent(peewee.Model):
    id = peewee.BigIntegerField(primary_key=True)
    job_id = peewee.UUIDField()
    attempt_id = peewee.UUIDField()
    kind = peewee.TextField()
    version = peewee.IntegerField(null=True)
    worker_id = peewee.TextField(null=True)
    observed_by = peewee.TextField(null=True)
    detail = peewee.TextField(null=True)
    recorded_at = peewee.DateTimeField()

    class Meta:
        table_name = "export_attempt_events"


class CancellationRequest(peewee.Model):
    tenant_id = peewee.UUIDField()
    id = peewee.UUIDField()
    job_id = peewee.UUIDField()
    requested_by = peewee.TextField()
    reason = peewee.TextField(null=True)
    outcome = peewee.TextField()
    found_status = peewee.TextField()
    found_attempt_id = peewee.UUIDField(null=True)
    found_attempt_count = peewee.IntegerField()
    found_delivery_authorized_at = peewee.DateTimeField(null=True)
    recorded_at = peewee.DateTimeField()

    class Meta:
        table_name = "cancellation_requests"
        primary_key = peewee.CompositeKey("tenant_id", "id")


class OutboxRow(peewee.Model):
    message_id = peewee.UUIDField(primary_key=True)
    kind = peewee.TextField()
    job_id = peewee.UUIDField()
    created_at = peewee.DateTimeField()
    published_at = peewee.DateTimeField(null=True)
    due_at = peewee.DateTimeField(null=True)

    class Meta:
        table_name = "outbox"



class CreateRequest(peewee.Model):
    tenant_id = peewee.UUIDField()
    id = peewee.UUIDField()
    kind = peewee.TextField()
    job_id = peewee.UUIDField()
    requested_by = peewee.TextField()
    destination_id = peewee.UUIDField(null=True)
    original_job_id = peewee.UUIDField(null=True)
    overwrite_agreement_ref = peewee.TextField(null=True)
    recorded_at = peewee.DateTimeField()

    class Meta:
        table_name = "create_requests"
        primary_key = peewee.CompositeKey("tenant_id", "id")


class Schedule(peewee.Model):
    id = peewee.UUIDField(primary_key=True)
    tenant_id = peewee.UUIDField()
    destination_id = peewee.UUIDField()
    cron = peewee.TextField()
    time_zone = peewee.TextField()
    incremental = peewee.BooleanField()
    state = peewee.TextField()
    next_fire_at = peewee.DateTimeField(null=True)
    created_by = peewee.TextField()
    created_at = peewee.DateTimeField()
    changed_by = peewee.TextField()
    changed_at = peewee.DateTimeField()

    class Meta:
        table_name = "schedules"


class ScheduleRun(peewee.Model):
    schedule_id = peewee.UUIDField()
    slot = peewee.DateTimeField()
    fire_at = peewee.DateTimeField()
    trigger = peewee.TextField()
    outcome = peewee.TextField()
    job_id = peewee.UUIDField(null=True)
    detail = peewee.TextField(null=True)
    recorded_at = peewee.DateTimeField()
    decided_at = peewee.DateTimeField()

    class Meta:
        table_name = "schedule_runs"
        primary_key = peewee.CompositeKey("schedule_id", "slot")


class WebhookEndpoint(peewee.Model):
    id = peewee.UUIDField(primary_key=True)
    tenant_id = peewee.UUIDField()
    name = peewee.TextField()

    class Meta:
        table_name = "webhook_endpoints"


class WebhookDelivery(peewee.Model):
    id = peewee.UUIDField(primary_key=True)
    endpoint_id = peewee.UUIDField()
    tenant_id = peewee.UUIDField()
    job_id = peewee.UUIDField()
    status = peewee.TextField()
    state = peewee.TextField()
    attempts = peewee.IntegerField()
    occurred_at = peewee.DateTimeField()
    finished_at = peewee.DateTimeField(null=True)

    class Meta:
        table_name = "webhook_deliveries"
