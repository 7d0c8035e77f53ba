"""The worker entry point: ``dramatiq app.actors.worker`` (wrapped as ``exports worker``).

Importing this module installs the broker chosen by ``EXPORTS_BROKER_URL`` as Dramatiq's global
broker, unless one is already installed, and declares the export actor on it: Dramatiq's CLI imports
the module and then consumes every queue declared on the global broker. Nothing connects here (the
embedded Redis starts on the broker's first connection). This is the only module that installs a
broker on import; the relay and the scheduler never import it.
"""

import dramatiq.broker as _dramatiq_broker

from app.actors import broker as _broker
from app.actors import export as _export

if _dramatiq_broker.global_broker is None:
    _broker.setup()

export_ready = _export.declare(_dramatiq_broker.get_broker())
