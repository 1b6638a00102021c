"""The layout of the house, read from the source with `ast`: who may import whom, no package-level import cycle,
small product modules, no copied block of product code, and one definition of each reserved key name.

Each check starts from an allow-list of the places that break it today, with the reason; a change that fixes one
removes it from the list, and a test below fails when an entry no longer matches anything, so the lists only
shrink."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract import Contract, keys

ROOT = Path(__file__).resolve().parents[1]
# The hand-written programs that ship in the image (charts/ is the chart generator, run from a checkout).
PRODUCT = ("common", "contract", "webhook", "node", "deviceplugin", "dra", "kubectlplugin", "certs")
# Everything else the import graph spans: the generator, the tiers' harness, the benchmarks, the release and the tests.
TOP_LEVEL = (*PRODUCT, "charts", "e2e", "bench", "release", "tests")
MAX_LINES = 350
WINDOW = 6
# The one module that spells the reserved key names; everyone else imports them from it.
KEY_MODULE = "contract/keys.py"


def _files(*folders: str, root: Path = ROOT) -> list[Path]:
    return sorted(
        path
        for folder in folders
        for path in (root / folder).rglob("*.py")
        if "_pb2" not in path.name and "__pycache__" not in path.parts
    )


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(node: ast.AST) -> Iterator[tuple[str, int]]:
    """Every module an import names, with its line: function-level imports count, `if TYPE_CHECKING:` does not."""
    if isinstance(node, ast.If) and _is_type_checking(node):
        for other in node.orelse:
            yield from _imports(other)
        return
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name, node.lineno
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        yield node.module, node.lineno
    for child in ast.iter_child_nodes(node):
        yield from _imports(child)


def _package_edges() -> dict[tuple[str, str], list[str]]:
    """(importer, imported) top-level package pairs, each with the places that make it."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for top in TOP_LEVEL:
        for path in _files(top):
            for module, line in _imports(_tree(path)):
                target = module.split(".")[0]
                if target in TOP_LEVEL and target != top:
                    edges[top, target].append(f"{_name(path)}:{line}")
    return edges


# ---------------------------------------------------------------------------------------------------------
# (a) The node programs, the kubectl plugin and the certificate tool never import the admission server.

INDEPENDENT = ("node", "deviceplugin", "dra", "kubectlplugin", "certs")
WEBHOOK_IMPORTS_ALLOWED: set[str] = set()


@pytest.mark.parametrize("package", INDEPENDENT)
def test_package_does_not_import_the_webhook(package: str) -> None:
    places = _package_edges().get((package, "webhook"), [])
    if package in WEBHOOK_IMPORTS_ALLOWED:
        assert places, f"{package} no longer imports webhook: remove it from WEBHOOK_IMPORTS_ALLOWED"
    else:
        assert not places, f"{package} imports webhook at {', '.join(places)}; import contract or common instead"


# The two node programs stand side by side on node/: neither imports the other, and node/ imports neither. Entries
# read "importer -> imported" (packages).
NODE_PROGRAMS = (("deviceplugin", "dra"), ("dra", "deviceplugin"), ("node", "deviceplugin"), ("node", "dra"))
NODE_IMPORTS_ALLOWED: set[str] = set()


@pytest.mark.parametrize(("source", "target"), NODE_PROGRAMS)
def test_node_programs_import_only_the_node_layer(source: str, target: str) -> None:
    places = _package_edges().get((source, target), [])
    if f"{source} -> {target}" in NODE_IMPORTS_ALLOWED:
        assert places, f"{source} no longer imports {target}: remove it from NODE_IMPORTS_ALLOWED"
    else:
        assert not places, f"{source} imports {target} at {', '.join(places)}; move what both use to node/"


# The layers under every program: common imports no other package of ours, the contract only common, and the
# certificate tool only both (webhook.server.serve uses certs.devcerts for --dev, one way).
LAYERS = {"common": set(), "contract": {"common"}, "certs": {"common", "contract"}}


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_lower_layer_imports_only_what_is_below_it(package: str) -> None:
    above = {target: places for (source, target), places in _package_edges().items()
             if source == package and target not in LAYERS[package]}
    assert not above, f"{package} imports {above}"


# The admission rules are pure (CONTRIBUTING.md, code conventions, rule 1): nothing in webhook/rules/ imports the
# server beside it, nor an HTTP, TLS or event-loop framework, directly or through another module of ours (contract,
# common, ...).

RULES = "webhook/rules"
SERVING = ("webhook.server", "flask", "werkzeug", "gunicorn", "asyncio", "ssl")
# Entries read "importer -> imported": a module of ours, and the entry of SERVING it imports.
RULES_IMPORTS_ALLOWED: set[str] = set()


def _module(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _source(module: str, root: Path) -> Path | None:
    """Our own module's file; None for a module from outside the repository, or a name that is no module."""
    base = root.joinpath(*module.split("."))
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


def _loads(path: Path, root: Path) -> Iterator[str]:
    """The modules an import in `path` may load: relative imports resolved, `from p import m` as p and p.m, and the
    packages above each (importing a.b.c runs a/__init__.py and a/b/__init__.py first)."""
    package = _module(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            above = package[: len(package) - node.level + 1] if node.level else []
            base = ".".join([*above, *filter(None, (node.module or "").split("."))])
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            parts = name.split(".")
            yield from (".".join(parts[:i]) for i in range(1, len(parts) + 1))


def _forbidden_imports(folder: str, forbidden: tuple[str, ...], root: Path = ROOT) -> dict[str, str]:
    """Each import of a `forbidden` module (or one under it) that `folder`'s modules reach through our own modules:
    "importer -> forbidden" and the chain of imports from `folder` to the importer."""
    found: dict[str, str] = {}
    todo = [(_module(path, root), path) for path in _files(folder, root=root)]
    chains = {module: module for module, _ in todo}
    while todo:
        module, path = todo.pop()
        for name in _loads(path, root):
            hit = next((f for f in forbidden if name == f or name.startswith(f"{f}.")), None)
            if hit is not None:
                found.setdefault(f"{module} -> {hit}", chains[module])
            elif name not in chains and (source := _source(name, root)) is not None:
                chains[name] = f"{chains[module]} -> {name}"
                todo.append((name, source))
    return found


def _write_tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_forbidden_import_finder_sees_one(tmp_path: Path) -> None:
    _write_tree(tmp_path, {
        "a/__init__.py": "",
        "a/rules/__init__.py": "",
        "a/rules/pure.py": "import json\nfrom a.rules import ok\n",
        "a/rules/ok.py": "from . import pure\n",
        "a/rules/direct.py": "def f():\n    import asyncio.events\n",
        "a/rules/relative.py": "from ..server import app\n",
        "a/rules/through.py": "from b.helper import x\n",
        "a/server/__init__.py": "",
        "a/server/app.py": "import flask\n",
        "b/__init__.py": "",
        "b/helper.py": "import ssl\nx = 1\n",
    })
    found = _forbidden_imports("a/rules", ("a.server", "flask", "asyncio", "ssl"), tmp_path)
    assert found == {
        "a.rules.direct -> asyncio": "a.rules.direct",
        "a.rules.relative -> a.server": "a.rules.relative",
        "b.helper -> ssl": "a.rules.through -> b.helper",
    }


def test_rules_import_nothing_of_the_server() -> None:
    found = _forbidden_imports(RULES, SERVING)
    unexpected = {edge: chain for edge, chain in found.items() if edge not in RULES_IMPORTS_ALLOWED}
    assert not unexpected, "webhook.rules reaches the serving side; pass the rules plain values instead:\n" + "\n".join(
        f"{edge} (reached by {chain})" for edge, chain in sorted(unexpected.items())
    )
    assert not RULES_IMPORTS_ALLOWED - set(found), f"no longer imported: {RULES_IMPORTS_ALLOWED - set(found)}"


# ---------------------------------------------------------------------------------------------------------
# (b) No import cycle between top-level packages.

CYCLES_ALLOWED: set[frozenset[str]] = set()


def _cycles(edges: set[tuple[str, str]]) -> set[frozenset[str]]:
    """The strongly connected groups of more than one package (Tarjan's algorithm, over a handful of nodes)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for source, target in edges:
        graph[source].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: set[frozenset[str]] = set()

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.add(frozenset(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_cycle_finder_sees_a_cycle() -> None:
    assert _cycles({("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}) == {frozenset("abc")}
    assert _cycles({("a", "b"), ("b", "c")}) == set()


def test_no_package_level_import_cycle() -> None:
    edges = _package_edges()
    found = _cycles(set(edges))
    unexpected = found - CYCLES_ALLOWED
    detail = [
        f"{a} -> {b}: {', '.join(edges[a, b][:3])}"
        for group in unexpected
        for a in sorted(group)
        for b in sorted(group)
        if (a, b) in edges
    ]
    assert not unexpected, "import cycle between packages:\n" + "\n".join(detail)
    assert not CYCLES_ALLOWED - found, f"no longer cycles, remove from CYCLES_ALLOWED: {CYCLES_ALLOWED - found}"


# ---------------------------------------------------------------------------------------------------------
# (c) Product modules stay small (CONTRIBUTING.md, rule 8); generated protobuf modules are left out.

@pytest.mark.parametrize("path", _files(*PRODUCT), ids=_name)
def test_product_module_is_small(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{_name(path)} has {lines} lines; split it by role (at most {MAX_LINES})"


# ---------------------------------------------------------------------------------------------------------
# (d) No block of six or more statements written twice in product code (imports and docstrings left out).

COPIES_ALLOWED: set[frozenset[str]] = set()


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _bodies(tree: ast.AST) -> Iterator[list[ast.stmt]]:
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                yield [s for s in body if not isinstance(s, ast.Import | ast.ImportFrom) and not _is_docstring(s)]


def _windows(paths: list[Path], root: Path = ROOT) -> dict[tuple[str, ...], list[str]]:
    """Each run of WINDOW statements (compared as syntax trees, without positions) and where it stands."""
    seen: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for path in paths:
        for body in _bodies(_tree(path)):
            dumped = [ast.dump(s) for s in body]
            name = path.relative_to(root).as_posix()
            for start in range(len(body) - WINDOW + 1):
                seen[tuple(dumped[start : start + WINDOW])].append(f"{name}:{body[start].lineno}")
    return seen


def test_copy_finder_sees_a_copy(tmp_path: Path) -> None:
    block = "".join(f"    x{i} = y + {i}\n" for i in range(WINDOW))
    (tmp_path / "a.py").write_text(f'def f(y):\n    """One."""\n    import os\n{block}')
    (tmp_path / "b.py").write_text(f"def g(y):\n{block}    return 0\n")
    (tmp_path / "c.py").write_text("def h(y):\n" + block.replace("y + 3", "y - 3"))
    copies = [places for places in _windows(sorted(tmp_path.glob("*.py")), tmp_path).values() if len(places) > 1]
    assert copies == [["a.py:4", "b.py:2"]]


def test_no_copied_block_in_product_code() -> None:
    copies = {
        frozenset(p.split(":")[0] for p in places): places
        for places in _windows(_files(*PRODUCT)).values()
        if len(places) > 1
    }
    unexpected = [places for files, places in copies.items() if files not in COPIES_ALLOWED]
    assert not unexpected, "the same statements stand in more than one place:\n" + "\n".join(
        " ~ ".join(places) for places in unexpected
    )
    assert not COPIES_ALLOWED - set(copies), f"no longer copied: {COPIES_ALLOWED - set(copies)}"


# ---------------------------------------------------------------------------------------------------------
# (e) One definition of each reserved key name: a module-level str constant whose whole value is a reserved
# annotation key, env name, resource or prefix belongs only in the key module. Tests spell names on purpose (they
# pin the wire format), so test_*.py files are not scanned; their harness modules are.

RESERVED = frozenset(
    {
        keys.DEFAULT_RESOURCE,
        keys.GPU_COUNT,
        keys.DEFAULT_PREFIX,
        keys.COMPAT_PREFIX,
        *keys.COMPAT_KEYS,
        *keys.RESERVED_ENV,
        *Contract().own_keys,
    }
)
DEFINITIONS_ALLOWED: set[str] = set()


def _pairs(target: ast.expr, value: ast.expr | None) -> Iterator[tuple[str, str]]:
    """`NAME = "text"`, and each name of `A, B = "a", "b"`."""
    if isinstance(target, ast.Name) and isinstance(value, ast.Constant) and isinstance(value.value, str):
        yield target.id, value.value
    elif isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
        for one, other in zip(target.elts, value.elts, strict=True):
            yield from _pairs(one, other)


def _definitions(path: Path) -> Iterator[tuple[str, str]]:
    for node in _tree(path).body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                yield from _pairs(target, node.value)
        elif isinstance(node, ast.AnnAssign):
            yield from _pairs(node.target, node.value)


def test_reserved_names_are_defined_once() -> None:
    found = {
        f"{_name(path)}:{name}": value
        for path in _files(*TOP_LEVEL)
        if _name(path) != KEY_MODULE and not path.name.startswith("test_")
        for name, value in _definitions(path)
        if value in RESERVED
    }
    unexpected = {place: value for place, value in found.items() if place not in DEFINITIONS_ALLOWED}
    assert not unexpected, f"reserved names defined outside {KEY_MODULE}; import them from it: {unexpected}"
    assert not DEFINITIONS_ALLOWED - set(found), f"no longer defined: {DEFINITIONS_ALLOWED - set(found)}"


# ---------------------------------------------------------------------------------------------------------
# (f) `kubectl gpushare` installs on its own (packaging/kubectl-gpushare): the distribution lists exactly the modules
# of ours the plugin's entry point reaches, and its dependencies are exactly the outside packages they import.

PLUGIN_ENTRY = "kubectlplugin.cli"
PLUGIN_PROJECT = ROOT / "packaging" / "kubectl-gpushare" / "pyproject.toml"
# The import name of each outside package the plugin may use, and its distribution; none of the server's.
PLUGIN_THIRD_PARTY = {"kubernetes": "kubernetes", "yaml": "PyYAML", "urllib3": "urllib3"}


def _closure(entry: str, root: Path = ROOT) -> tuple[set[str], set[str]]:
    """(our modules `entry` reaches through its imports, function-level ones included; the top-level names of the
    outside packages they import)."""
    ours, outside, todo = {entry}, set(), [entry]
    while todo:
        module = todo.pop()
        path = _source(module, root)
        assert path is not None, module
        for name in _loads(path, root):
            top = name.split(".")[0]
            if _source(name, root) is not None:
                if name not in ours:
                    ours.add(name)
                    todo.append(name)
            elif top not in sys.stdlib_module_names and _source(top, root) is None:
                outside.add(top)
    return ours, outside


def test_the_plugin_distribution_holds_its_import_closure_and_nothing_else() -> None:
    setuptools = tomllib.loads(PLUGIN_PROJECT.read_text(encoding="utf-8"))["tool"]["setuptools"]
    listed = set(setuptools["py-modules"])
    shipped = listed | {m.rsplit(".", 1)[0] for m in listed}  # each module's package comes with it
    ours, _ = _closure(PLUGIN_ENTRY)
    assert not {m.split(".")[0] for m in ours} - {"common", "contract", "kubectlplugin"}, sorted(ours)
    assert ours == shipped, (f"the plugin imports {sorted(ours - shipped)} that {PLUGIN_PROJECT} does not list, and "
                             f"it lists {sorted(shipped - ours)} that the plugin does not import")


def test_the_plugin_depends_on_what_it_imports_from_outside() -> None:
    _, outside = _closure(PLUGIN_ENTRY)
    assert outside <= set(PLUGIN_THIRD_PARTY), f"the plugin imports {sorted(outside - set(PLUGIN_THIRD_PARTY))}"
    declared = tomllib.loads(PLUGIN_PROJECT.read_text(encoding="utf-8"))["project"]["dependencies"]
    names = {re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0] for d in declared}
    assert names == {PLUGIN_THIRD_PARTY[m] for m in outside}, (names, outside)


def test_closure_finder_sees_function_level_and_outside_imports(tmp_path: Path) -> None:
    _write_tree(tmp_path, {
        "a/__init__.py": "",
        "a/cli.py": "import json\nfrom a import low\n",
        "a/low.py": "def f():\n    import kubernetes.client\n    from b.util import x\n",
        "a/unused.py": "import flask\n",
        "b/__init__.py": "",
        "b/util.py": "import yaml\nx = 1\n",
    })
    assert _closure("a.cli", tmp_path) == ({"a", "a.cli", "a.low", "b", "b.util"}, {"kubernetes", "yaml"})
