"""Tenants' webhooks: the notifier process (``sender``), the request it makes (``client``), the body
(``payload``) and its signature (``signing``). The deliveries themselves are written by the statements
that give exports their outcomes, in ``app/store``."""
