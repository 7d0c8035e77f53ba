"""`make bench`: every benchmark, each reporting a ratio against a ceiling measured in the same run."""

import importlib
import pkgutil
import sys
from pathlib import Path

for module in sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if not m.name.startswith("_")):
    print(f"== bench.{module}", flush=True)
    sys.argv = [f"bench.{module}"]
    importlib.import_module(f"bench.{module}").main()
