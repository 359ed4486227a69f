"""Our package ``platform`` shadows the standard library's; it must re-export all of it."""

import multiprocessing
import pickle
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import platform
from tests._spawn_child import probe

ROOT = Path(__file__).resolve().parent.parent


def test_driver_sees_our_package_with_the_stdlib_namespace():
    assert Path(platform.__file__).resolve() == ROOT / "platform" / "__init__.py"
    assert platform.system() in {"Linux", "Darwin", "Windows"}
    assert platform.python_version() == ".".join(map(str, sys.version_info[:3]))
    assert platform.machine()
    uname = platform.uname()
    assert uname.system == platform.system()
    assert pickle.loads(pickle.dumps(uname)) == uname


def test_every_public_stdlib_name_is_reexported():
    stdlib = {}
    path = Path(sysconfig.get_paths()["stdlib"]) / "platform.py"
    exec(compile(path.read_text(), str(path), "exec"), stdlib)
    missing = [n for n in stdlib if not n.startswith("__") and not hasattr(platform, n)]
    assert missing == []


def test_heavy_imports_work_in_the_driver():
    import pandas
    import ray
    import torch

    assert torch.tensor([1.0]).sum().item() == 1.0
    assert pandas.DataFrame({"a": [1]}).shape == (1, 1)
    assert ray.__version__


def test_spawn_child_sees_a_working_platform():
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        out = pool.apply(probe)
    assert out["system"] == platform.system()
    # The pickled uname from the child unpickles here (same class name, platform.uname_result).
    assert pickle.loads(out["uname"]) == platform.uname()


def test_uname_pickled_by_us_unpickles_in_a_plain_interpreter(tmp_path):
    blob = tmp_path / "uname.pkl"
    blob.write_bytes(pickle.dumps(platform.uname()))
    code = (
        "import pickle, platform, sys; "
        f"u = pickle.loads(open({str(blob)!r}, 'rb').read()); "
        "assert u == platform.uname(), u; print(platform.__file__)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "site-packages" not in out.stdout and str(ROOT) not in out.stdout


@pytest.mark.parametrize("module", ["ray", "torch", "pandas", "uuid"])
def test_python_m_from_the_repo_root_imports_heavy_modules(module):
    code = f"import platform, {module}; assert platform.__file__.endswith('platform/__init__.py')"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
