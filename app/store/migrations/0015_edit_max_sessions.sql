-- `destination edit --max-sessions`: the sessions a partner accepts at once change with the partner
-- (`destination check` counts them), and lowering it must not take the owner writing SQL.
GRANT UPDATE (max_sessions) ON destinations TO exports_app;
