"""Every third-party module the tests import is installed by ``pip install -e ".[dev]"``.

CI and new users install only what ``pyproject.toml`` names; a module that happens to be on the
developer's machine hides a missing install step (issue 22: the tests read TensorBoard's event
files with the ``tensorboard`` package, which no extra installed). The check walks the
requirement closure of the project's dependencies plus its ``[dev]`` extra through the installed
distributions' own metadata, and compares it with the top-level imports of ``tests/``.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
FIRST_PARTY = {
    "platform",
    "trainables",
    "data_prep",
    "stage1_common",
    "tests",
    "benchmarks",
    "conftest",
}


def _requirements(dist: metadata.Distribution, extras: set[str]) -> list[Requirement]:
    """The requirements of ``dist`` that apply here with ``extras`` requested."""
    picked = []
    for text in dist.requires or []:
        req = Requirement(text)
        envs = [{"extra": e} for e in extras] or [{"extra": ""}]
        if req.marker is None or any(req.marker.evaluate(env) for env in envs):
            picked.append(req)
    return picked


def dev_closure(pyproject: dict) -> tuple[set[str], list[str]]:
    """Canonical names of every distribution that ``pip install -e ".[dev]"`` brings in, found
    through the installed metadata, and the requirements that are not installed at all."""
    project = pyproject["project"]
    own = canonicalize_name(project["name"])
    extras = project.get("optional-dependencies", {})
    todo = [Requirement(t) for t in project.get("dependencies", []) + extras.get("dev", [])]
    seen: dict[str, set[str]] = {}
    missing = []
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name == own:  # the project's own extras, e.g. stage1-platform[loggers]
            todo += [Requirement(t) for e in req.extras for t in extras.get(e, [])]
            continue
        wanted = set(req.extras)
        if name in seen and wanted <= seen[name]:
            continue
        seen.setdefault(name, set()).update(wanted)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            missing.append(str(req))
            continue
        todo += _requirements(dist, seen[name])
    return set(seen), missing


def imported_top_levels(folder: Path) -> dict[str, list[str]]:
    """Top-level module name -> files under ``folder`` that import it (absolute imports only)."""
    found: dict[str, list[str]] = {}
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], []).append(str(path.relative_to(ROOT)))
    return found


def uncovered_imports(pyproject: dict, folder: Path = ROOT / "tests") -> list[str]:
    """One line per third-party module imported under ``folder`` that no distribution of the
    ``[dev]`` closure provides."""
    closure, missing = dev_closure(pyproject)
    providers = metadata.packages_distributions()
    local = {p.stem for p in folder.rglob("*.py")}
    problems = [f"{req}: required by pyproject.toml but not installed" for req in missing]
    for module, files in sorted(imported_top_levels(folder).items()):
        if module in sys.stdlib_module_names or module in FIRST_PARTY or module in local:
            continue
        dists = {canonicalize_name(d) for d in providers.get(module, [])}
        if not dists & closure:
            by = ", ".join(sorted(dists)) or "no installed distribution"
            problems.append(
                f"{module} (imported by {files[0]}) comes from {by}, which pyproject.toml's "
                "dependencies and [dev] extra do not install; add it to [dev]"
            )
    return problems


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_module_the_tests_import_is_installed_by_the_dev_extra():
    assert uncovered_imports(_pyproject()) == []


def test_a_module_dropped_from_the_dev_extra_is_named():
    """The check above can fail: without ``tensorboard`` in ``[dev]`` the reader that
    tests/test_loggers.py imports is named, although the package is installed here."""
    pyproject = _pyproject()
    dev = pyproject["project"]["optional-dependencies"]["dev"]
    dev[:] = [r for r in dev if canonicalize_name(Requirement(r).name) != "tensorboard"]
    problems = uncovered_imports(pyproject)
    assert len(problems) == 1, problems
    assert problems[0].startswith("tensorboard (imported by tests/")
    assert "add it to [dev]" in problems[0]


def test_the_closure_follows_extras_and_markers():
    """``ray[tune]`` brings its tune extra's requirements, and the project's own
    ``stage1-platform[loggers]`` brings wandb: the closure is the installed metadata's."""
    closure, missing = dev_closure(_pyproject())
    assert missing == []
    assert {"ray", "tensorboardx", "wandb", "mlflow-skinny", "pytest"} <= closure
    no_extras = {"project": {"name": "x", "dependencies": ["pytest>=8"]}}
    small, _ = dev_closure(no_extras)
    assert "pytest" in small and "wandb" not in small and "ray" not in small
