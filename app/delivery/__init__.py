"""Where a file goes: the partner destination over SFTP, before and after cutoff 2, its evidence, and the
verdicts drawn from it.

Read in this order:

- ``destination``: ``Destination.prepare()`` (session, baseline, decision, while the job is Running),
  ``Destination.deliver()`` (prepare and complete), ``probe()`` and ``inspect()``; the entry point for
  the runner and recovery. ``upload``: what ``prepare`` hands back, ``Ready``, whose ``complete()``
  uploads under a temporary name, renames without overwriting and confirms, after cutoff 2.
- ``classifier``: the outcomes (``Completed``, ``Failed``, ``Unknown``), ``classify``, which turns
  an interrupted delivery into one, and ``cause_of``, which says whether an error is transient.
- ``sessions``: where a delivery gets its session: a new one, or a worker's pool of warm ones, each
  within its destination's session slots; ``session``: the paramiko connection itself.
- ``listing``: what a final name holds, on an open session; ``evidence``: ``Listing``, ``Evidence``,
  ``Receipt`` and ``Proof``, with their JSON both ways.
- ``verdicts``: what recovery and reconciliation conclude from the evidence an attempt appended.
- ``config``: ``DestinationConfig``, built from a ``destinations`` row and validated on the spot.
- ``credentials`` and ``hostkeys``: the one parser of a credential reference and of a pinned host
  key line, shared with the CLI; ``errors``: the error tree.
"""
