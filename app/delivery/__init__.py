"""Where a file goes after cutoff 2: the partner destination over SFTP, its evidence, and the verdicts drawn from it.

Read in this order:

- ``destination``: ``Destination.deliver()`` (baseline, upload under a temporary name, no-overwrite
  rename, confirmation) and ``Destination.inspect()``; the entry point for the runner and recovery.
- ``classifier``: the outcomes (``Completed``, ``Failed``, ``Unknown``) and ``classify``, which turns
  an interrupted delivery into one.
- ``evidence``: ``Listing``, ``Evidence``, ``Receipt`` and ``Proof``, with their JSON both ways.
- ``verdicts``: what recovery and reconciliation conclude from the evidence an attempt appended.
- ``config``: ``DestinationConfig``, built from a ``destinations`` row and validated on the spot.
- ``credentials`` and ``hostkeys``: the one parser of a credential reference and of a pinned host
  key line, shared with the CLI; ``session``: the paramiko connection; ``errors``: the error tree.
"""
