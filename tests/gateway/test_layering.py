"""The gateway's packages keep their layers: infrastructure (gateway/'s top-level modules and its intake,
observability and process packages) imports neither a package above it nor the composition root, the generation
core and the tools import no API package, and no API package reaches into another's routes. Read from the source
(every import, relative ones resolved), so a violation names its line."""

from __future__ import annotations

import ast
from pathlib import Path

from paths import ROOT

GATEWAY = ROOT / "gateway"
COMPOSITION = {
    "gateway.app", "gateway.cli", "gateway.services", "gateway.openapi", "gateway.config", "gateway.config_reference"
}  # fmt: skip
API = ("gateway.responses", "gateway.chat", "gateway.conversations", "gateway.models_api")
INFRASTRUCTURE = ("gateway.intake", "gateway.observability", "gateway.process")
PACKAGES = ("gateway.generation", "gateway.hosted", "gateway.tenants", "gateway.usage", *API)


def _module_name(path: Path) -> str:
    parts = path.relative_to(GATEWAY.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every import of a gateway module in `path`."""
    name = _module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if node.module is None:  # `from . import x`: the modules it names
                found.extend((node.lineno, f"{target}.{alias.name}") for alias in node.names)
            else:
                found.append((node.lineno, target))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
    return [(line, target) for line, target in found if target == "gateway" or target.startswith("gateway.")]


def _inside(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == package or module.startswith(package + ".") for package in packages)


def _violations(forbidden_for) -> list[str]:
    problems = []
    for path in sorted(GATEWAY.rglob("*.py")):
        module = _module_name(path)
        for line, target in _imports(path):
            reason = forbidden_for(module, target)
            if reason:
                problems.append(f"{path.relative_to(GATEWAY.parent)}:{line} imports {target}: {reason}")
    return problems


def _infrastructure(module: str) -> bool:
    top_level = module.count(".") == 1 and module not in COMPOSITION and not _inside(module, API)
    return top_level or _inside(module, INFRASTRUCTURE)


def test_infrastructure_imports_no_package_above_it_nor_the_composition_root():
    def rule(module: str, target: str) -> str | None:
        if _infrastructure(module) and (_inside(target, PACKAGES) or target in COMPOSITION):
            return "infrastructure depends only on other infrastructure"
        return None

    assert _violations(rule) == []


def test_gateway_s_top_level_stays_small():
    """Loose modules are gathered into packages by concept; past about 20, group them again."""
    loose = [path.name for path in GATEWAY.glob("*.py") if path.name != "__init__.py"]
    assert len(loose) <= 20, sorted(loose)


def test_the_core_and_the_tools_import_no_api_package_nor_the_composition_root_and_tools_not_the_core():
    def rule(module: str, target: str) -> str | None:
        core_or_tools = _inside(module, ("gateway.generation", "gateway.hosted"))
        if core_or_tools and (_inside(target, API) or target in COMPOSITION):
            return "the core and the tools serve every API; an API package builds on them"
        if _inside(module, ("gateway.hosted",)) and _inside(target, ("gateway.generation",)):
            return "the tools answer calls with typed results; the core's loop calls them"
        return None

    assert _violations(rule) == []


def test_no_api_package_imports_another_ones_routes():
    def rule(module: str, target: str) -> str | None:
        own = next((package for package in API if _inside(module, (package,))), None)
        if own and _inside(target, API) and not _inside(target, (own,)) and target.endswith(".api"):
            return "a route module is not a library"
        return None

    assert _violations(rule) == []


def test_the_checks_see_imports():
    """The rules above would pass on a tree they cannot read: they must find the imports that are there."""
    imports = dict((target, line) for line, target in _imports(GATEWAY / "generation" / "plan.py"))
    assert "gateway.generation.prompt" in imports and "gateway.observability.metrics" in imports
    responses = [target for _, target in _imports(GATEWAY / "responses" / "prepare.py")]
    assert "gateway.generation.plan" in responses


def test_no_modules_import_each_other_in_a_circle():
    """Function-level imports included: a shared piece belongs below both modules that use it."""
    modules = {_module_name(path): path for path in GATEWAY.rglob("*.py")}
    edges = {name: {t for _, t in _imports(path) if t in modules and t != name} for name, path in modules.items()}
    cycles, state = [], {}

    def visit(name: str, trail: list[str]) -> None:
        state[name] = "open"
        for target in sorted(edges[name]):
            if state.get(target) == "open":
                cycles.append(" -> ".join([*trail[trail.index(target) :], target]))
            elif target not in state:
                visit(target, [*trail, target])
        state[name] = "done"

    for name in sorted(modules):
        if name not in state:
            visit(name, [name])
    assert cycles == []
