"""The plan of the package: layers as folders, imports only downward, no circles."""

from __future__ import annotations

import ast

from conftest import REPO

# Bottom to top; a module may import its own layer or any layer below it.
LAYERS = ("errors", "runtime", "io", "sharding", "progress", "problem", "fem", "topopt",
          "scoring", "data", "evaluation", "rl", "training", "app")
SIDE_BY_SIDE = {frozenset({"rl", "training"})}  # neither imports the other


def _imports():
    package = REPO / "sphyr_jax"
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        if len(parts) < 2 or parts[1] not in LAYERS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = node.module.split(".")
                if names[0] == "sphyr_jax" and len(names) > 1:
                    yield path, parts[1], names[1]
                elif node.module == "sphyr_jax":
                    for alias in node.names:
                        yield path, parts[1], alias.name


def test_every_import_goes_down_the_layers():
    upward = [(str(path.relative_to(REPO)), here, there) for path, here, there in _imports()
              if there in LAYERS and LAYERS.index(there) > LAYERS.index(here)
              and frozenset({here, there}) not in SIDE_BY_SIDE]
    assert upward == []


def test_every_layer_says_its_job():
    for layer in ("problem", "fem", "topopt", "scoring", "data", "evaluation", "rl",
                  "training", "app"):
        doc = ast.get_docstring(ast.parse((REPO / "sphyr_jax" / layer / "__init__.py")
                                          .read_text()))
        assert doc and len(doc.split()) >= 25, layer


def test_no_import_circles_between_modules():
    graph: dict[str, set[str]] = {}
    package = REPO / "sphyr_jax"
    for path in package.rglob("*.py"):
        mod = ".".join(path.relative_to(REPO).with_suffix("").parts)
        deps = graph.setdefault(mod, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and \
                    node.module.startswith("sphyr_jax.") and not mod.endswith("__init__"):
                deps.add(node.module)
    seen, stack = set(), []

    def visit(mod):
        if mod in stack:
            raise AssertionError(f"import circle: {' -> '.join(stack[stack.index(mod):] + [mod])}")
        if mod in seen:
            return
        seen.add(mod)
        stack.append(mod)
        for dep in graph.get(mod, ()):
            if dep in graph:
                visit(dep)
        stack.pop()

    for mod in list(graph):
        visit(mod)
    assert len(seen) > 50  # every module of the package was walked
