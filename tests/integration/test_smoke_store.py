from app.store import jobs
from app.store.types import Status


def test_a_created_job_is_queued_with_its_delivery_and_one_wakeup(seed):
    job = seed.queued()
    assert seed.status(job) is Status.QUEUED
    assert len(seed.outbox(job)) == 1


def test_claim_then_authorize_then_complete_records_each_event(seed):
    job = seed.finished(Status.COMPLETED)
    assert seed.event_kinds(job) == ["Claimed", "DeliveryAuthorized", "Finished"]
