"""The workloads of `python -m bench`, in the issue's order (see bench/harness.py)."""

from bench.workloads import cancellation, claims, lease, partner_files, peers, relay, scale, stages, views
from bench.workloads.end_to_end import END_TO_END
from bench.workloads.wakeup import WAKEUP

ALL = [END_TO_END, WAKEUP, relay.WORKLOAD, lease.WORKLOAD, scale.WORKLOAD, cancellation.WORKLOAD, claims.WORKLOAD,
       peers.WORKLOAD, stages.WORKLOAD, views.WORKLOAD, partner_files.WORKLOAD]
