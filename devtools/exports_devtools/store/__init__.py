"""The test equipment's own statements (``sql/<module>.sql`` beside ``<module>.py``, named
``<module>_<verb>``), run through a catalog of their own: the product's statement table never holds them."""

from pathlib import Path

from app.store.connector import Catalog
from app.store.statements import load

queries = Catalog(load(Path(__file__).with_name("sql")))
