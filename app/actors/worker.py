"""The worker entry point: ``dramatiq app.actors.worker`` (wrapped as ``exports worker``).

Importing this module configures the process's logging (EXPORTS_LOG_FORMAT), installs the broker
chosen by ``EXPORTS_BROKER_URL`` as Dramatiq's global broker, unless one is already installed, with
the worker's middleware (deduplication, the process's heartbeat and scavenger, and Dramatiq's
Prometheus middleware when ``exports worker`` configured its address), and declares the export actor
on it: Dramatiq's CLI imports the module and then consumes every queue declared on the global broker.
Nothing connects here (the embedded Redis starts on the broker's first connection). This is the only
module that installs a broker on import; the relay and the scheduler never import it.
"""

import logging
import os

import dramatiq.broker as _dramatiq_broker

from app import logs as _logs
from app.actors import broker as _broker
from app.actors import export as _export
from app.actors.process import ProcessServices
from app.config import Settings

_settings = Settings.from_env()
_settings.require_broker()   # a worker given a shared database must be given the shared broker
_logs.configure(_settings.log_format, level=logging.DEBUG if _settings.debug else logging.INFO)

if _dramatiq_broker.global_broker is None:
    _installed = _broker.setup(_settings)
    _installed.add_middleware(ProcessServices(_settings))
    if "dramatiq_prom_host" in os.environ:
        from dramatiq.middleware.prometheus import Prometheus

        _installed.add_middleware(Prometheus())

export_ready = _export.declare(_dramatiq_broker.get_broker())
