"""The project's shape: imports point down, no import circle anywhere, a module per concern and
a folder per concern.

Layers, top to bottom (a module imports only from its own layer or below):

    platform's CLI modules (tune, train, analyze, report, stability, leak, grafana, calibrate,
    catalogue)
    platform.execution > platform.control > platform.record > platform.analysis
    > platform.spaces > platform.storage > platform.errors
    trainables, data_prep (never each other)
    stage1_common

Within a layer, some packages must not import some modules (``FORBIDDEN``): the resident
package (trainables/resident/) owns the protocol between the group pool and the trials, and the
trial function (trainables/trial.py) uses it, never the reverse.

Code that runs in Ray workers (trainables, data_prep, stage1_common) must never import the
driver package ``platform.*``: workers import the standard library's ``platform`` first, so our
submodules do not exist there. Function-local imports count: one that hides a circle is still
a circle.

Cohesion decides a module's size, not a number: a long module that holds one thing reads better
than two cut to fit a cap, and a module doing two jobs is split however short it is. What can be
checked of that: every module's docstring says its one concern on its first line, and every
folder of ``ROOMS_CHECKED`` holds at most ``ROOM_SIZE`` modules at its top (more is a hall, not a
room: group them by concern). ``RUNAWAY_LINES`` only catches a runaway file.

A run folder's file names are spelled in stage1_common/output_root.py alone (RunFolder,
CheckpointFolder); every other module asks those classes.

Whether an output root is a folder or on object storage is asked in three modules alone
(``BUCKET_QUESTION_HOMES``); everything else holds an object that answers.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from stage1_common.output_root import CheckpointFolder, OutputRoot, RunFolder

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("platform", "trainables", "data_prep", "stage1_common")
WORKER_SIDE = ("trainables", "data_prep", "stage1_common", "search_spaces")
OUR_SUBMODULES = {
    p.stem if p.suffix == ".py" else p.name
    for p in (ROOT / "platform").iterdir()
    if (p.suffix == ".py" or (p / "__init__.py").is_file()) and p.stem != "__init__"
}
# Higher imports lower. platform's top-level modules other than errors are the CLIs (rank 9).
LAYERS = {
    "platform.execution": 8,
    "platform.control": 7,
    "platform.record": 6,
    "platform.analysis": 5,
    "platform.spaces": 4,
    "platform.storage": 3,
    "platform.errors": 2,
    "trainables": 1,
    "data_prep": 1,
    "stage1_common": 0,
}
CLI_LAYER = 9
# Package -> the modules none of its modules may import (function-local imports included).
FORBIDDEN = {"trainables.resident": ("trainables.trial",)}
# The folders whose every package is a room: at most ROOM_SIZE modules at its top, the rest in
# subpackages by concern. platform/ is regrouped on its own (platform/analysis/ holds 14); it
# joins this list once its packages are rooms.
ROOMS_CHECKED = ("platform", "trainables", "data_prep", "stage1_common")
ROOM_SIZE = 12
# A backstop for a runaway file, not a size rule: more than twice the longest module today
# (trainables/config/trial_config.py, 98 keys with their docs, 573 lines).
RUNAWAY_LINES = 1000


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


def module_files(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``packages`` under ``root``."""
    out = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports, anywhere in its file (function-local imports
    included). ``from pkg import name`` points at ``pkg.name`` when that is a module."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [
                    f"{node.module}.{a.name}"
                    if f"{node.module}.{a.name}" in modules
                    else node.module
                    for a in node.names
                ]
            else:
                continue
            edges |= {t for t in targets if t in modules and t != name}
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer(module: str) -> int:
    for prefix, rank in LAYERS.items():
        if module == prefix or module.startswith(prefix + "."):
            return rank
    if module == "platform":
        return 0  # the standard-library shim, imported by everything
    return CLI_LAYER


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for source, targets in sorted(graph.items()):
        for target in sorted(targets):
            top = {source.split(".")[0], target.split(".")[0]}
            if top == {"trainables", "data_prep"}:
                out.append(f"{source} imports {target}: trainables and data_prep are siblings")
            elif layer(target) > layer(source):
                out.append(f"{source} imports {target}, a layer above it")
    return out


def forbidden_imports(graph: dict[str, set[str]]) -> list[str]:
    """The imports ``FORBIDDEN`` rules out."""

    def within(module: str, package: str) -> bool:
        return module == package or module.startswith(package + ".")

    out = []
    for source, targets in sorted(graph.items()):
        for package, banned in FORBIDDEN.items():
            if not within(source, package):
                continue
            for target in sorted(targets):
                if any(within(target, b) for b in banned):
                    out.append(f"{source} imports {target}: {package} imports none of {banned}")
    return out


def test_detector_catches_each_form():
    assert driver_imports("import platform.tune") == ["platform.tune"]
    assert driver_imports("from platform.spaces import load_space") == ["platform.spaces"]
    assert driver_imports("from platform import analysis") == ["platform.analysis"]
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


def test_imports_point_down_the_layers():
    assert layering_violations(import_graph(module_files())) == []


def test_no_import_circle_anywhere():
    assert circles(import_graph(module_files())) == []


def test_a_planted_circle_and_an_upward_import_are_found(tmp_path):
    """The checks above can fail: a circle hidden in a function-local import, and a record
    module importing execution, are both reported."""
    pkg = tmp_path / "platform"
    for sub in ("record", "execution"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "record" / "a.py").write_text("from platform.record.b import x\n")
    (pkg / "record" / "b.py").write_text(
        "def x():\n    from platform.record import a\n    from platform.execution.c import y\n"
    )
    (pkg / "execution" / "c.py").write_text("y = 1\n")
    graph = import_graph(module_files(tmp_path, ("platform",)))
    assert circles(graph) == [["platform.record.a", "platform.record.b"]]
    assert layering_violations(graph) == [
        "platform.record.b imports platform.execution.c, a layer above it"
    ]


def test_the_resident_package_imports_nothing_of_the_trial_function():
    modules = module_files()
    assert {"trainables.resident", "trainables.resident.pool", "trainables.trial"} <= set(modules)
    assert forbidden_imports(import_graph(modules)) == []


def test_a_planted_import_of_the_trial_function_from_the_resident_package_is_found(tmp_path):
    """The check above can fail: the pool building its trainer from trial.py, inside a function,
    is reported; trial.py importing the pool is not."""
    resident = tmp_path / "trainables" / "resident"
    resident.mkdir(parents=True)
    for init in (tmp_path / "trainables", resident):
        (init / "__init__.py").write_text("")
    (tmp_path / "trainables" / "trial.py").write_text("from trainables.resident import pool\n")
    (resident / "pool.py").write_text(
        "def run():\n    from trainables import trial\n    trial.build_group_trainer()\n"
    )
    graph = import_graph(module_files(tmp_path, ("trainables",)))
    assert forbidden_imports(graph) == [
        "trainables.resident.pool imports trainables.trial: trainables.resident imports none of "
        "('trainables.trial',)"
    ]


def test_platform_is_split_into_subpackages():
    subpackages = {p.name for p in (ROOT / "platform").iterdir() if (p / "__init__.py").is_file()}
    assert {"spaces", "execution", "control", "record", "storage", "analysis"} <= subpackages
    top = {p.stem for p in (ROOT / "platform").glob("*.py")} - {"__init__", "errors", "__main__"}
    assert top == {
        "tune",
        "train",
        "analyze",
        "report",
        "stability",
        "leak",
        "grafana",
        "calibrate",
        "catalogue",
    }


def modules_at_top(root: Path = ROOT, roots: tuple[str, ...] = ROOMS_CHECKED) -> dict[str, int]:
    """Folder (relative to ``root``) -> its modules at the top (``.py`` files but
    ``__init__.py``), for each of ``roots`` and every folder under them that holds Python."""
    out = {}
    for name in roots:
        for folder in sorted({p.parent for p in (root / name).rglob("*.py")}):
            count = sum(1 for p in folder.glob("*.py") if p.name != "__init__.py")
            out[folder.relative_to(root).as_posix()] = count
    return out


def halls(counts: dict[str, int]) -> list[str]:
    """The folders with more than ROOM_SIZE modules at their top."""
    return [f"{folder}: {n} modules" for folder, n in sorted(counts.items()) if n > ROOM_SIZE]


def missing_concerns(modules: dict[str, Path]) -> list[str]:
    """The modules whose docstring does not say their concern on its first line: none at all,
    or one that starts with an empty line."""
    out = []
    for name, path in sorted(modules.items()):
        doc = ast.get_docstring(ast.parse(path.read_text(), str(path)), clean=False)
        if not doc or not doc.splitlines()[0].strip():
            out.append(f"{name}: no concern on its docstring's first line")
    return out


def test_every_folder_is_a_room_not_a_hall():
    """A folder per concern: a reader finds who owns what from the folder names alone, which a
    folder of more than a dozen modules no longer tells."""
    counts = modules_at_top()
    assert {"trainables", "trainables/engine", "data_prep", "stage1_common"} <= set(counts)
    assert halls(counts) == []


def test_every_module_says_its_one_concern_on_its_first_line():
    assert missing_concerns(module_files()) == []


def test_no_module_runs_away():
    """A long module is fine when it holds one thing (TrialConfig's keys with their docs are one
    table; Ray Tune's pbt.py is 34 KB and easy to read); the 400-line cap this replaces made
    TrialConfig's keys two files. This only catches a file that grew past any reading."""
    long = {
        str(path.relative_to(ROOT)): n
        for path in module_files().values()
        if (n := len(path.read_text().splitlines())) > RUNAWAY_LINES
    }
    assert long == {}


def test_a_hall_and_a_module_without_its_concern_are_found(tmp_path):
    """The checks above can fail: a package of 13 modules at its top (its subpackage's do not
    count), a module without a docstring and one whose docstring starts with an empty line."""
    room = tmp_path / "trainables" / "room"
    room.mkdir(parents=True)
    for init in (tmp_path / "trainables", room):
        (init / "__init__.py").write_text('"""A package."""\n')
    for i in range(13):
        (tmp_path / "trainables" / f"m{i}.py").write_text(f'"""Module {i}."""\n')
    for i in range(ROOM_SIZE):
        (room / f"r{i}.py").write_text(f'"""Room module {i}."""\n')
    (room / "r0.py").write_text("x = 1\n")
    (room / "r1.py").write_text('"""\nA concern, one line too late.\n"""\n')
    counts = modules_at_top(tmp_path, ("trainables",))
    assert counts == {"trainables": 13, "trainables/room": ROOM_SIZE}
    assert halls(counts) == ["trainables: 13 modules"]
    assert missing_concerns(module_files(tmp_path, ("trainables",))) == [
        "trainables.room.r0: no concern on its docstring's first line",
        "trainables.room.r1: no concern on its docstring's first line",
    ]


def test_the_driver_checks_manifests_and_builds_tokenizers_without_torch(tmp_path):
    """The driver never trains: importing torch for a manifest's columns or the text encoder's
    vocabulary cost every platform.tune 2.6 s of CPU on 2 cores
    (trainables/data/manifest_table.py)."""
    import subprocess
    import sys

    rows = "".join(f"u{i}\tu{i}.flac\t16000\t16000\tthe cat sat on mat {i}\n" for i in range(8))
    (tmp_path / "m.tsv").write_text("utt_id\tpath\tnum_samples\tsample_rate\ttranscript\n" + rows)
    space = tmp_path / "space.yaml"
    space.write_text(
        "description: one manifest run\nresources: {train_workers: 1, use_gpu: false}\n"
        f"fixed: {{dataset: manifest, model_size: tiny, manifest_path: {tmp_path / 'm.tsv'}}}\n"
    )
    code = f"""
import sys
from platform.execution.inputs import prepare_tokenizers
from stage1_common.output_root import OutputRoot
from platform.spaces.expand import expand_runs
from platform.spaces.load import load_space
from platform.spaces.preflight import check_inputs
space = load_space({str(space)!r})
runs = expand_runs(space)
check_inputs(space, runs)
(run,) = prepare_tokenizers(runs, OutputRoot({str(tmp_path / "out")!r}))
print(run.config.tokenizer_path, "torch" in sys.modules)
"""
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    path, torch_imported = out.stdout.split()
    assert Path(path).is_file() and path.startswith(str(tmp_path / "out"))
    assert torch_imported == "False"


# --- a run folder's names are spelled in stage1_common/output_root.py only -------------------

NAMES_HOME = "stage1_common/output_root.py"
# How each name is looked for; "prefix" for any name not listed. ``prefix``: a constant starting
# with the name (a pattern's text before its first "{"); ``longer``: the same, but longer than
# that; ``exact``: equal to it; ``path``: a word too common to look for anywhere, so only as a
# part of a path (see ``spelled_names``).
MATCH = {
    RunFolder.CHECKPOINT: "longer",  # "checkpoint_step" alone is a result field, not a folder
    RunFolder.CHECKPOINT_PREFIX: "exact",  # many result fields start with "checkpoint_"
    RunFolder.WORKERS: "path",
    RunFolder.WORKERS_PREVIOUS: "path",
    RunFolder.WORKER: "path",  # "rank..." starts many keys and messages
    RunFolder.WORKER_LOG: "path",
    RunFolder.EXPORT: "path",  # export_model, export_s...
    RunFolder.EXPORT_SPEECH: "path",
    RunFolder.EXPORT_TEXT: "path",
    CheckpointFolder.DCP: "path",  # also the prefix of a temporary folder outside any run
    CheckpointFolder.DEEPSPEED: "path",
    OutputRoot.RUNS: "path",  # a key of summaries and groups
}
CHECKED = (*RunFolder.NAMES, *CheckpointFolder.NAMES, OutputRoot.RUNS)
# The same spelling meaning another file: (module, constant) -> why it may stay.
ALLOWED = {
    ("trainables/model/pretrained.py", "config.json"): "save_pretrained's own file, not the run's",
}
_PATH_CALLS = {"join", "joinpath", "remote_join", "with_name", "glob", "rglob"}
_PATH_TYPES = {"Path", "PurePath", "PurePosixPath"}


def _rendered(node: ast.AST) -> str:
    """A str constant's value, or an f-string's text with each replacement field as ``{}``."""
    if isinstance(node, ast.Constant):
        return node.value
    return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)


def _pattern(name: str) -> re.Pattern:
    """``name`` as a regex over rendered text: each replacement field is ``{}`` or ``*``."""
    pieces = re.split(r"\{[^}]*\}", name)
    return re.compile(r"(?:\{\}|\*)".join(re.escape(p) for p in pieces))


def _spells(text: str, name: str, in_path: bool) -> bool:
    mode = MATCH.get(name, "prefix")
    stem = name.partition("{")[0]
    if mode == "prefix":
        return text.startswith(stem)
    if mode == "longer":
        return text.startswith(stem) and len(text) > len(stem)
    if mode == "exact":
        return text == name
    if "{" not in name:  # a plain word: a part of a path handed to a path operation
        return in_path and name in text.split("/")
    # A pattern ("rank{rank}.json"): the whole text, or a part of a path; a text with a "/"
    # and no whitespace is a relative path (not prose).
    pathlike = in_path or ("/" in text and not any(c.isspace() for c in text))
    parts = text.split("/") if pathlike else [text]
    return any(_pattern(name).fullmatch(part) for part in parts)


def spelled_names(source: str, names: tuple[str, ...] = CHECKED) -> list[tuple[int, str, str]]:
    """(line, constant, name) for each string constant of ``source`` that spells one of
    ``names``: a str constant, or an f-string's text with its replacement fields as ``{}``.
    Documentation is left out: a string statement (a docstring) is no code. A ``path`` word
    counts only as a part of a path (the text split at its ``/``) that is an operand of ``/``
    or an argument of ``Path(...)``, ``.join``, ``.joinpath``, ``.remote_join``,
    ``.with_name``, ``.glob`` or ``.rglob``; a ``path`` pattern anywhere as a whole text or,
    in a text with a ``/`` and no whitespace (a relative path, not prose), as a part of it."""
    tree = ast.parse(source)
    skip: set[int] = set()
    in_path: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            skip.add(id(node.value))
        elif isinstance(node, ast.JoinedStr):
            skip |= {id(v) for v in node.values}  # checked as the f-string's text
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            in_path |= {id(node.left), id(node.right)}
        elif isinstance(node, ast.Call):
            func = node.func
            if (isinstance(func, ast.Attribute) and func.attr in _PATH_CALLS) or (
                isinstance(func, ast.Name) and func.id in _PATH_TYPES
            ):
                in_path |= {id(a) for a in node.args}
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        is_str = isinstance(node, ast.Constant) and isinstance(node.value, str)
        if is_str or isinstance(node, ast.JoinedStr):
            text = _rendered(node)
            found += [
                (node.lineno, text, n) for n in names if _spells(text, n, id(node) in in_path)
            ]
    return found


def test_a_run_folders_names_are_spelled_only_where_they_are_defined():
    """Every name of a run's folder (``runs/<run>/``: RunFolder's, its checkpoints':
    CheckpointFolder's, and ``runs`` itself) has one home, stage1_common/output_root.py: no
    other module of the packages spells one in a string constant or an f-string (comments and
    docstrings may, to describe the layout).

    The names come from the classes (``NAMES``); how each is looked for is decided per name
    (MATCH) so that a look-alike meaning something else is not taken for it. A specific name
    (``state.pt``, ``meta.json``, ``stacks-rank{rank}.txt``...) counts wherever a constant
    starts with it (a pattern: with its text before "{"). ``checkpoint_step`` counts only with
    more after it (alone it is a result field); ``checkpoint_`` only alone (many result fields
    start so). Common words (``runs``, ``workers``, ``previous``, ``export``, ``speech``,
    ``text``, ``ds``, ``dcp``) count only as a part of a path handed to a path operation, and
    ``rank{rank}.json`` / ``rank{rank}.{stream}.log`` only as a whole text or a part of a path.
    ALLOWED lists the constants that spell a name but mean another file."""
    offenders = []
    for path in module_files().values():
        rel = path.relative_to(ROOT).as_posix()
        if rel == NAMES_HOME:
            continue
        for line, text, name in spelled_names(path.read_text()):
            if (rel, text) not in ALLOWED:
                offenders.append(f"{rel}:{line}: {text!r} spells {name!r}")
    assert offenders == []


def test_a_spelled_name_is_found_in_each_form():
    """The check above can fail: each form of spelling a name is found, and the look-alikes
    that mean something else are not."""
    spelled = [
        'p = folder / "state.pt"',
        'rel.startswith("stacks-rank")',
        'p = folder / f"done-rank{rank}.json"',
        'sorted(run_dir.glob("checkpoint_step*"))',
        'name = f"checkpoint_step{step:07d}"',
        'any(p.startswith("checkpoint_") for p in parts)',
        'base = tmp / "runs" / run',
        'remote.join("workers/rank1.json")',
        'where = f"{w}/rank{rank}.{stream}.log"',
        'name = f"rank{rank}.json"',
        'records = workers / "rank*.json"',
        'previous = workers / "previous"',
        'export = root.remote_join(RUNS, run, "export")',
        "print(f\"{export / 'speech'}\")",
    ]
    for source in spelled:
        assert spelled_names(source), source
    different = [
        '"""A docstring naming runs/<run>/stacks-rank<r>.txt and meta.json."""',
        'row["checkpoint_step"] = 1',
        'x = {"runs": 3, "workers": 2, "export": "final", "rank": 0}',
        'label = "ok/runs"',
        'key = "checkpoint_save_s"',
        'help = "see runs/<run>/stacks-rank<r>.txt and workers/ when a run fails"',
        'tmp = tempfile.mkdtemp(prefix="dcp-writer-start-")',
        "model.text(x)",
    ]
    for source in different:
        assert spelled_names(source) == [], source


# --- a run crosses the Ray boundary as a RunTicket: its dict is read in trainables/ticket.py only

TICKET_HOME = "trainables/ticket.py"
# Names the run's dict went by, and still would: a run (``run``), a train function's argument
# (``loop_config``), the driver's param space (``param``), the resident pool's first group
# (``first``).
RUN_DICT_NAMES = {"run", "loop_config", "param", "first"}
RUN_DICT_ATTRS = {"run"}  # an object's run: ``job.run``, ``assignment.run``
# Tune's trial config (``config`` in the trial function, ``trial.config`` in the driver's
# callbacks): a run dict under its "run" key.
TUNE_CONFIG = "config"
_KEY_METHODS = {"get", "pop", "setdefault"}


def _keyed(node: ast.AST) -> tuple[ast.AST, str] | None:
    """(container, key) of ``X["key"]`` or ``X.get("key", ...)`` / ``.pop`` / ``.setdefault``,
    or of ``"key" in X``; None for anything else."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        key = node.slice.value
        return (node.value, key) if isinstance(key, str) else None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
        first = node.args[0]
        if node.func.attr in _KEY_METHODS and isinstance(first, ast.Constant):
            return (node.func.value, first.value) if isinstance(first.value, str) else None
    if isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant):
        if isinstance(node.left.value, str) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            return node.comparators[0], node.left.value
    return None


def _names_a_run_dict(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id in RUN_DICT_NAMES
    if isinstance(node, ast.Attribute):
        return node.attr in RUN_DICT_ATTRS
    # X["run"], whatever X is; a run dict's part (run["config"]) is a run dict too.
    keyed = _keyed(node)
    return keyed is not None and (keyed[1] == "run" or _names_a_run_dict(keyed[0]))


def run_dict_reads(source: str) -> list[tuple[int, str]]:
    """(line, code) of each read or write of a run's dict by a string key in ``source``: a
    string-keyed subscript (``X["k"]``, read or assigned), ``X.get("k")`` / ``.pop`` /
    ``.setdefault`` or ``"k" in X``, where X is

    - a name the run's dict goes by (``RUN_DICT_NAMES``: run, loop_config, param, first) or an
      attribute ``.run`` (``job.run``);
    - a string-keyed read of "run" (``X["run"]["name"]``, ``X["run"].get(...)``), or of any key
      of a run dict (``run["config"]["executor"]``);
    - or, for the key "run" only, Tune's trial config: a name or attribute ``config``
      (``config["run"]``, ``trial.config["run"]``).

    Other dicts are not runs: manifest and metrics rows (``row``, ``rec``, ``r``), records read
    from files (``record["config"]``), data frames (``df["run"]``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        keyed = _keyed(node)
        if keyed is None:
            continue
        container, key = keyed
        tune_config = (isinstance(container, ast.Name) and container.id == TUNE_CONFIG) or (
            isinstance(container, ast.Attribute) and container.attr == TUNE_CONFIG
        )
        if _names_a_run_dict(container) or (key == "run" and tune_config):
            found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def test_no_module_reads_a_run_dict_by_key_outside_the_ticket():
    """A run travels as a ``RunTicket`` (trainables/ticket.py): the driver builds it where it
    hands the run to Tune, and every process decodes it once. No other module of platform/,
    trainables/, data_prep/ or stage1_common/ reads or writes a run's dict by a string key
    (``run_dict_reads`` says what counts)."""
    offenders = []
    for path in module_files().values():
        rel = path.relative_to(ROOT).as_posix()
        if rel != TICKET_HOME:
            offenders += [
                f"{rel}:{line}: {code}" for line, code in run_dict_reads(path.read_text())
            ]
    assert offenders == []


def test_a_run_dict_read_by_key_is_found_in_each_form():
    """The check above can fail: each way the run's dict was read before the ticket (issue 44)
    is found, and the dicts that are not runs are not."""
    read = [
        'run["config"]["executor"]',
        'job.run["config"].get("stall_timeout_s")',
        'cfg = TrialConfig.from_dict(loop_config["config"])',
        'pool = loop_config["pool"]',
        'scratch = run.get("scratch")',
        'trial.config["run"]["name"]',
        'run = dict(config["run"], trial_start_ts=time.time())',
        'param["scratch"] = root.path.name',
        'cpus = first.get("group_cpus")',
        'resident = "pool" in run',
        'x = event["run"]["name"]',
    ]
    for source in read:
        assert run_dict_reads(source), source
    not_runs = [
        'share = row.get("data_share")',
        'names = [r["run"] for r in manifest]',
        'timing[timing["run"] == run]',
        'config = dict(record["config"])',
        'value = config["max_steps"]',
        "name = ticket.name",
        "stall = job.ticket.config.stall_timeout_s",
    ]
    for source in not_runs:
        assert run_dict_reads(source) == [], source


# --- the bucket question: "is the output root a folder or on object storage?" ---------------

# The modules that may ask it: what an address is, the output root's owner, and the driver's
# one chooser for a staged root. Everything else holds an object that answers: an OutputRoot
# (shown, where), a Location, a run's place (trainables/run_folder/place.py: InFolder or
# InBucket, chosen by the driver when it builds the run's ticket).
BUCKET_QUESTION_HOMES = {
    "stage1_common/storage.py",
    "stage1_common/output_root.py",
    "platform/storage/mirror.py",
}
# How the question is spelled (issue 55's measure, ``git grep -E``): an object's ``.remote``
# read as a value (a Ray ``.remote(...)`` call is not), ``is_remote(``, ``remote_join(``,
# ``.on_bucket``, ``.folder is None``, ``.staged``.
BUCKET_QUESTION = re.compile(
    r"\.remote\b([^(]|$)|is_remote\(|remote_join\(|\.on_bucket\b|\.folder is None|\.staged\b"
)


def asks_the_bucket_question(source: str) -> list[tuple[int, str]]:
    """(line, text) of each line of ``source`` that asks whether a root is on a bucket, as the
    measure spells it (``BUCKET_QUESTION``, matched line by line as ``git grep`` does)."""
    return [
        (n, line.strip())
        for n, line in enumerate(source.splitlines(), 1)
        if BUCKET_QUESTION.search(line)
    ]


def test_the_bucket_question_is_asked_in_three_modules_only():
    """Whether the output root is a folder or on object storage is decided in
    stage1_common/storage.py (what an address is), stage1_common/output_root.py (the owner) and
    platform/storage/mirror.py (the driver's one chooser for a staged root); every other module
    of platform/, trainables/, data_prep/ and stage1_common/ holds an object that answers
    (a null object or a strategy: InFolder / InBucket, RunsInFolder / RunsInBucket), and never
    branches on it."""
    asking = {}
    for path in module_files().values():
        found = asks_the_bucket_question(path.read_text())
        if found:
            asking[path.relative_to(ROOT).as_posix()] = found
    offenders = [
        f"{rel}:{line}: {text} asks whether the root is on a bucket; only "
        f"{sorted(BUCKET_QUESTION_HOMES)} may: hold an object that answers instead"
        for rel, found in sorted(asking.items())
        if rel not in BUCKET_QUESTION_HOMES
        for line, text in found
    ]
    assert offenders == []
    assert set(asking) == BUCKET_QUESTION_HOMES  # each home still answers it (the measure holds)


def test_a_bucket_question_is_found_in_each_form():
    """The check above can fail: each spelling of the question is found, and a Ray call or a
    word that only looks like it is not."""
    asked = [
        "if root.remote:",
        "address = root.remote",
        "return self.remote or str(self.path)",
        "if is_remote(folder):",
        "where = root.remote_join(RUNS, run)",
        "if storage.on_bucket:",
        "if root.folder is None:",
        "if files.staged:",
        "from trainables.checkpoint.remote import choose",  # a module named so: renamed
    ]
    for source in asked:
        assert asks_the_bucket_question(source), source
    not_asked = [
        "ref = actor.run.remote(name, 3)",
        "handle = ray.remote(GroupPool).options(num_cpus=0).remote(name)",
        "remote_workers = 2",
        "from trainables.checkpoint import in_bucket",
        "if place.per_node:",
        "staged_note(root)",
    ]
    for source in not_asked:
        assert asks_the_bucket_question(source) == [], source
