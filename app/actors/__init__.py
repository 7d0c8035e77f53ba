"""The worker's parts: the export actor and its middleware, the runner and what it runs (policy,
builder, lease keeper, stop watcher), and the deduplication store. The worker process that wires them
to a broker is ``app/worker.py``; nothing in this package installs a broker.
"""
