"""The chaos checker's settled world (``test_chaos_checker.world``), for the checker's other test modules."""

from tests.integration.devtools.test_chaos_checker import world  # noqa: F401
