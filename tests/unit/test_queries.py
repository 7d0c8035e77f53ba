"""The vocabulary of named statements: every statement is run by the store module its name starts with,
no name is defined twice, no module outside app/store runs SQL, and no store module hands execute()
SQL built from values."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from app.store.statements import SQL_DIR, STATEMENTS, load, parse

APP = Path(__file__).resolve().parents[2] / "app"
_NAME_LINE = re.compile(r"^-- name: (\S+)", re.MULTILINE)
#: A statement run through a catalog: ``connector.<verb>(conn, "name", ...)`` in the product, ``queries.<verb>``
#: in the test equipment.
_USE = re.compile(
    r"""(?:connector|queries)\.(?:execute|fetch_one|fetch_all|copy|text)\(\s*(?:\w+,\s*)?["']([a-z_]+)["']""")
#: Calls that send SQL, or open a way to: none of them may appear outside app/store.
SQL_CALLS = {"execute", "executemany", "execute_sql", "cursor", "copy_expert"}

#: Calls whose first argument is SQL text.
EXECUTORS = {"execute", "executemany", "execute_sql"}
#: psycopg.sql composition: the way to put identifiers into SQL.
SQL_CLASSES = {"SQL", "Identifier", "Literal", "Placeholder", "Composed"}
#: (module, first argument) pairs that fit no rule below, each for a reason.
EXCEPTIONS = {
    # `exports db migrate` applies the schema file and the numbered migrations shipped with the package.
    ("store/migrate.py", "step.text()"),
    # The connector is the one place a statement's text is looked up by a name it is handed.
    ("store/connector.py", "self.text(name)"),
    # Role and login names composed with sql.Identifier and sql.Literal in statements(), DDL that takes no
    # bind parameters.
    ("store/logins.py", "statement"),
}


def _sources() -> dict[str, str]:
    return {str(path.relative_to(APP)): path.read_text(encoding="utf-8") for path in sorted(APP.rglob("*.py"))}


# --- the checker -----------------------------------------------------------------------------------


def _is_literal(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _is_named_statement(node: ast.AST) -> bool:
    """``text("name")`` or ``connector.text("name")``: a statement from the SQL files, with its name."""
    if not (isinstance(node, ast.Call) and node.args and _is_literal(node.args[0])):
        return False
    func = node.func
    return (isinstance(func, ast.Name) and func.id == "text") or (
        isinstance(func, ast.Attribute) and func.attr == "text"
        and isinstance(func.value, ast.Name) and func.value.id == "connector")


def _is_sql_composition(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return False
    func = node.func
    if isinstance(func.value, ast.Name) and func.value.id == "sql" and func.attr in SQL_CLASSES:
        # sql.SQL(f"...") would smuggle values in as SQL text.
        return func.attr != "SQL" or (bool(node.args) and _is_literal(node.args[0]))
    return func.attr in {"format", "join"} and _is_sql_composition(func.value)


def _is_compiled_query(node: ast.AST) -> bool:
    """``query.sql()``: peewee's compiler, which keeps every value a parameter."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "sql"
            and not node.args and not node.keywords)


def _assigned_values(scope: ast.AST, name: str, *, top_level_only: bool = False) -> list[ast.AST]:
    """The values assigned to ``name`` in ``scope``; a tuple target yields the whole right side."""
    nodes = scope.body if top_level_only else list(ast.walk(scope))
    values: list[ast.AST] = []
    for node in nodes:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        else:
            continue
        for target in targets:
            names = target.elts if isinstance(target, ast.Tuple) else [target]
            if any(isinstance(n, ast.Name) and n.id == name for n in names):
                values.append(node.value)
    return values


def _constant(node: ast.AST, module: ast.Module, seen: frozenset[str] = frozenset()) -> bool:
    """Text fixed when the module was written: literals, module constants, f-strings and sums of them."""
    if _is_literal(node):
        return True
    if isinstance(node, ast.Name) and node.id not in seen:
        values = _assigned_values(module, node.id, top_level_only=True)
        return bool(values) and all(_constant(v, module, seen | {node.id}) for v in values)
    if isinstance(node, ast.JoinedStr):
        return all(_is_literal(v) or (isinstance(v, ast.FormattedValue) and _constant(v.value, module, seen))
                   for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _constant(node.left, module, seen) and _constant(node.right, module, seen)
    return False


def _scope_of(node: ast.AST, module: ast.Module) -> ast.AST:
    """The innermost function around ``node``: the last, in walk order, that contains it."""
    functions = [n for n in ast.walk(module) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    return next((f for f in reversed(functions) if any(n is node for n in ast.walk(f))), module)


def _arguments_for(function: ast.FunctionDef | ast.AsyncFunctionDef, name: str, module: ast.Module) -> list[ast.AST]:
    """What the module's own calls of ``function`` pass for its parameter ``name``; None for a call
    that passes it some way this check cannot follow (``*args``, ``**kwargs``)."""
    positional = [a.arg for a in function.args.posonlyargs + function.args.args]
    if positional and positional[0] in ("self", "cls"):
        positional = positional[1:]
    index = positional.index(name) if name in positional else None
    passed: list[ast.AST] = []
    for call in ast.walk(module):
        if not isinstance(call, ast.Call):
            continue
        callee = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)
        if callee != function.name:
            continue
        keyword = next((k.value for k in call.keywords if k.arg == name), None)
        if keyword is not None:
            passed.append(keyword)
        elif index is not None and index < len(call.args) and not any(
                isinstance(a, ast.Starred) for a in call.args[:index + 1]):
            passed.append(call.args[index])
        else:
            passed.append(None)
    return passed


def _allowed(node: ast.AST, scope: ast.AST, module: ast.Module, seen: frozenset[str] = frozenset()) -> bool:
    if _is_named_statement(node) or _is_sql_composition(node) or _is_compiled_query(node):
        return True
    if _constant(node, module):
        return True
    if isinstance(node, ast.Name) and node.id not in seen and scope is not module:
        seen = seen | {node.id}
        values = _assigned_values(scope, node.id)
        if values:
            # A local variable is as safe as every value assigned to it in the same function.
            return all(_allowed(v, scope, module, seen) for v in values)
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            # A parameter is as safe as every argument the module passes for it.
            passed = _arguments_for(scope, node.id, module)
            return bool(passed) and all(
                a is not None and _allowed(a, _scope_of(a, module), module, seen) for a in passed)
    return False


def unsafe_executions(module: str, source: str) -> list[str]:
    """The execute() calls in ``source`` whose SQL is not a named statement, text fixed in the module,
    a psycopg.sql composition or a compiled peewee query, as ``module:line: argument``."""
    tree = ast.parse(source)
    found: list[str] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in EXECUTORS and node.args):
            continue
        if isinstance(node.func.value, ast.Name) and node.func.value.id == "connector":
            continue   # connector.execute(conn, "name", ...): a named statement by construction
        argument = node.args[0]
        if not _allowed(argument, _scope_of(node, tree), tree) and (module, ast.unparse(argument)) not in EXCEPTIONS:
            found.append(f"{module}:{node.lineno}: {ast.unparse(argument)}")
    return found


# --- the tests -------------------------------------------------------------------------------------


def test_every_named_statement_is_run_by_the_store_module_its_name_starts_with():
    sources = _sources()
    misplaced = sorted(name for name in STATEMENTS
                       if name not in _USE.findall(sources.get(f"store/{name.split('_')[0]}.py", "")))

    assert misplaced == []


def test_every_statement_of_the_test_equipment_is_run_by_its_store_module_and_none_is_missing():
    import exports_devtools.store as equipment
    from exports_devtools.store import queries

    store = Path(equipment.__file__).parent
    sources = {p.stem: p.read_text(encoding="utf-8") for p in store.glob("*.py")}
    misplaced = sorted(name for name in queries.statements
                       if name not in _USE.findall(sources.get(name.split("_")[0], "")))
    named = {name for source in sources.values() for name in _USE.findall(source)}

    assert misplaced == []
    assert sorted(named - set(queries.statements)) == []


def test_every_statement_named_in_app_exists():
    named = {name for source in _sources().values() for name in _USE.findall(source)}

    assert sorted(named - set(STATEMENTS)) == []


def test_no_statement_name_is_defined_twice_across_the_sql_files():
    names = [name for path in sorted(SQL_DIR.glob("*.sql")) for name in _NAME_LINE.findall(path.read_text())]

    assert len(names) == len(set(names)) == len(STATEMENTS)


def test_the_loader_refuses_a_statement_named_for_another_module(tmp_path):
    (tmp_path / "one.sql").write_text("-- name: two_read\nSELECT 1;\n")

    with pytest.raises(ValueError, match="must be named one_"):
        load(tmp_path)


def sql_outside_the_store(module: str, source: str) -> list[str]:
    """Where a module outside app/store sends SQL itself: a call that runs a statement or opens a
    cursor, ``psycopg.connect``, or any use of peewee, as ``module:line: code``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                # A statement needs its text: a Redis pipeline's execute() takes none.
                (node.func.attr in SQL_CALLS and (node.args or node.func.attr not in EXECUTORS))
                or (node.func.attr == "connect" and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "psycopg")):
            found.append(f"{module}:{node.lineno}: {ast.unparse(node.func)}")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            if any(n == "peewee" or n.startswith("peewee.") for n in names):
                found.append(f"{module}:{node.lineno}: import peewee")
            imported = [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []
            from_store = isinstance(node, ast.ImportFrom) and node.module == "app.store" and "models" in imported
            if any(n == "app.store.models" for n in names) or from_store:
                found.append(f"{module}:{node.lineno}: import app.store.models")
    return found


def test_no_module_outside_app_store_runs_sql():
    found = [hit for module, source in _sources().items() if not module.startswith("store/")
             for hit in sql_outside_the_store(module, source)]

    assert found == []


@pytest.mark.parametrize("snippet", [
    'conn.execute("SELECT 1")',
    'with conn.cursor() as cur: pass',
    'psycopg.connect(url)',
    'import peewee',
    'from peewee import fn',
    'from app.store import models',
])
def test_the_outside_check_flags_sql_sent_without_the_store(snippet):
    assert sql_outside_the_store("snippet.py", snippet)


def test_the_outside_check_passes_a_redis_pipeline_execute_that_carries_no_statement():
    assert sql_outside_the_store("snippet.py", "replies = pipe.execute(raise_on_error=False)") == []


def test_the_parser_refuses_a_name_defined_twice_in_one_file():
    text = "-- name: a\nSELECT 1;\n-- name: b\nSELECT 2;\n-- name: a\nSELECT 3;\n"

    with pytest.raises(ValueError, match="'a' is defined twice"):
        parse(text, origin="twice.sql")


def test_the_parser_keeps_each_statement_under_its_name():
    text = "-- preamble\n-- name: first\n-- why\nSELECT 1;\n\n-- name: second\nSELECT %(x)s;\n"

    assert parse(text) == {"first": "-- why\nSELECT 1;", "second": "SELECT %(x)s;"}


def test_no_store_module_builds_sql_from_values_for_execute():
    found = [hit for module, source in _sources().items() if module.startswith("store/")
             for hit in unsafe_executions(module, source)]

    assert found == []


UNSAFE = [
    'conn.execute(f"SELECT * FROM jobs WHERE id = {job_id}")',
    'conn.execute("SELECT * FROM jobs WHERE id = " + str(job_id))',
    'conn.execute("SELECT * FROM jobs WHERE id = %s" % job_id)',
    'conn.execute("SELECT * FROM {}".format(table))',
    'conn.execute(text("x") + " LIMIT 1")',
    'conn.execute(sql.SQL(f"SET ROLE {role}"))',
    'def f(conn, column):\n    query = "SELECT " + column\n    conn.execute(query)',
    'cursor.executemany(" ".join(parts), rows)',
    'def f(conn, channel):\n    conn.execute(f"LISTEN {channel}")',
    'CHANNEL = input()\ndef f(conn):\n    conn.execute(f"LISTEN {CHANNEL}")',
    'def query(conn, statement):\n    conn.execute(statement)\nquery(c, "SELECT 1")\nquery(c, "SELECT " + x)',
    'def query(conn, statement):\n    conn.execute(statement)',
    'def query(conn, statement):\n    conn.execute(statement)\nquery(c, *args)',
]

SAFE = [
    'conn.execute(connector.text("export_claim"), params)',
    "conn.execute(\"SELECT set_config('lock_timeout', %s, true)\", (timeout,))",
    'conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role.value)))',
    'def f(conn):\n    query = text("export_claim")\n    conn.execute(query, {})',
    'READ = "SELECT 1"\ndef f(conn):\n    conn.execute(READ)',
    'CHANNEL = "exports_stop"\ndef f(conn):\n    conn.execute(f"LISTEN {CHANNEL}")',
    'def f(conn, query):\n    text, params = query.sql()\n    conn.execute(text, params)',
    'Job.select().execute()',
    'class D:\n    def query(self, statement):\n        self.c.execute(statement)\n'
    '    def status(self):\n        return self.query("SELECT 1")\nD().query(statement="SELECT 2")',
]


@pytest.mark.parametrize("snippet", UNSAFE)
def test_the_checker_flags_sql_built_from_values(snippet):
    assert unsafe_executions("snippet.py", snippet)


@pytest.mark.parametrize("snippet", SAFE)
def test_the_checker_accepts_named_statements_fixed_text_and_sql_composition(snippet):
    assert unsafe_executions("snippet.py", snippet) == []
