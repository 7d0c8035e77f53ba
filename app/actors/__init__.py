"""The worker's parts: the export actor and its middleware, the runner and what it runs (policy,
builder, lease keeper, stop watcher), the broker and the deduplication store.

Importing this package, or any module in it but ``app.actors.worker``, installs no broker.
"""
