"""pgbench as a ceiling: the store's own statement text, run by pgbench at the same concurrency.

``script(name, values)`` takes the statement exactly as ``app.store.connector.text(name)`` sends it and
turns its psycopg parameters into pgbench ones: ``%(job_id)s`` becomes whatever ``values`` maps
``job_id`` to (an SQL expression over pgbench variables, so each client walks its own rows), or the
pgbench variable ``:job_id`` when ``values`` does not name it.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from shutil import which

from psycopg.conninfo import conninfo_to_dict

from app.store import connector

_PARAM = re.compile(r"%\((\w+)\)s")


def binary() -> str:
    """pgbench from PATH, else PostgreSQL 15's; Debian ships it in postgresql-contrib / postgresql-15."""
    found = which("pgbench") or ("/usr/lib/postgresql/15/bin/pgbench"
                                 if Path("/usr/lib/postgresql/15/bin/pgbench").exists() else None)
    if found is None:
        raise RuntimeError("pgbench is not installed (Debian: apt-get install postgresql-contrib)")
    return found


def statement(name: str, values: dict[str, str] | None = None) -> str:
    """The named statement on one line (pgbench ends a command at a line's ';'), parameters translated."""
    values = values or {}
    text = _PARAM.sub(lambda m: values.get(m.group(1), ":" + m.group(1)), connector.text(name))
    lines = (line.split("--")[0].strip() for line in text.splitlines())
    folded = " ".join(line for line in lines if line)
    return folded if folded.endswith(";") else folded + ";"


def sql_line(text: str) -> str:
    """Any SQL (psycopg parameters allowed) on one line, for the same translation by hand."""
    folded = " ".join(line.split("--")[0].strip() for line in text.splitlines() if line.strip())
    return _PARAM.sub(lambda m: ":" + m.group(1), folded)


@dataclass(frozen=True)
class Result:
    tps: float
    #: Mean latency per transaction, in milliseconds (pgbench's own figure).
    latency_ms: float
    transactions: int
    #: Per script, when several were given: its tps.
    script_tps: list[float] = field(default_factory=list)
    failed: int = 0
    output: str = ""


def run(url: str, scripts: list[str], *, clients: int, transactions: int | None = None,
        seconds: float | None = None, role: str = "exports_app", variables: dict[str, object] | None = None,
        options: str = "", weights: list[int] | None = None, prepared: bool = True,
        log_latencies: bool = False) -> Result:
    """Runs pgbench with ``scripts`` (each a file's text) as ``role``; -t per client or -T seconds.

    -M prepared: psycopg prepares a statement from its fifth run on a connection, so both sides run
    the statement prepared."""
    params = conninfo_to_dict(url)
    files = []
    try:
        for i, text in enumerate(scripts):
            handle = tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False)
            handle.write(text)
            handle.close()
            weight = f"@{weights[i]}" if weights else ""
            files += ["-f", handle.name + weight]
        env = dict(os.environ, PGOPTIONS=f"-c role={role} {options}".strip())
        cmd = [binary(), "-n", "-c", str(clients), "-j", str(min(clients, os.cpu_count() or 1))]
        if prepared:
            cmd += ["-M", "prepared"]
        cmd += ["-t", str(transactions)] if transactions is not None else ["-T", str(max(1, round(seconds or 5)))]
        for name, value in (variables or {}).items():
            cmd += ["-D", f"{name}={value}"]
        cmd += files + ["-h", str(params.get("host", "127.0.0.1")), "-p", str(params.get("port", 5432)),
                        "-U", str(params.get("user", "postgres")), str(params["dbname"])]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"pgbench failed ({done.returncode}):\n{done.stderr[-2000:]}")
    finally:
        for name in files[1::2]:
            os.unlink(name.split("@")[0])
    out = done.stdout
    tps = float(re.search(r"tps = ([\d.]+) \(without initial connection time\)", out).group(1))
    latency = re.search(r"latency average = ([\d.]+) ms", out)
    processed = re.search(r"number of transactions actually processed: (\d+)", out)
    failed = re.search(r"number of failed transactions: (\d+)", out)
    script_tps = [float(t) for t in re.findall(r"SQL script \d+:.*?tps = ([\d.]+)\)", out, re.DOTALL)]
    return Result(tps, float(latency.group(1)) if latency else 0.0, int(processed.group(1)) if processed else 0,
                  script_tps, int(failed.group(1)) if failed else 0, out)
