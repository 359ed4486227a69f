"""Code that runs in Ray workers must never import the driver package ``platform.*``: workers
import the standard library's ``platform`` first, so our submodules do not exist there."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORKER_SIDE = ("trainables", "data_prep", "search_spaces")
OUR_SUBMODULES = {p.stem for p in (ROOT / "platform").glob("*.py")} - {"__init__"}


def driver_imports(source: str) -> list[str]:
    """Imports of our platform package in ``source``: ``platform.x`` modules, or names of our
    submodules taken from ``platform``. ``import platform`` alone is the standard module."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("platform.")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.startswith("platform."):
                found.append(node.module)
            elif node.module == "platform":
                found += [f"platform.{a.name}" for a in node.names if a.name in OUR_SUBMODULES]
    return found


def test_detector_catches_each_form():
    assert driver_imports("import platform.tune") == ["platform.tune"]
    assert driver_imports("from platform.spaces import load_space") == ["platform.spaces"]
    assert driver_imports("from platform import stats") == ["platform.stats"]
    assert driver_imports("import platform\nplatform.system()") == []
    assert driver_imports("from platform import system") == []


@pytest.mark.parametrize("package", WORKER_SIDE)
def test_worker_side_packages_do_not_import_platform(package):
    offenders = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for name in driver_imports(path.read_text()):
            offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offenders == []


def test_platform_init_holds_only_the_reexport():
    tree = ast.parse((ROOT / "platform" / "__init__.py").read_text())
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert defined <= {"_load_stdlib_platform"}
