"""Where compiled code and FLOPs counts are kept (stage1_common/machine_cache.py): the
compile_cache_dir key, else STAGE1_CACHE_DIR, else the user's cache folder; a relative key is
refused with one line; a run's compile caches point there, a user's own inductor folder wins."""

import os
from pathlib import Path

import pytest

from stage1_common.machine_cache import CACHE_ENV, machine_cache
from trainables.config import ConfigError, TrialConfig


def test_the_key_wins_then_the_variable_then_the_users_cache_folder(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "env"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert machine_cache("~/mine") == Path.home() / "mine"
    assert machine_cache("") == tmp_path / "env"
    monkeypatch.delenv(CACHE_ENV)
    assert machine_cache("") == tmp_path / "xdg" / "stage1"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert machine_cache("") == Path.home() / ".cache" / "stage1"


def test_a_relative_cache_folder_is_refused_naming_the_key_and_the_fix():
    with pytest.raises(
        ConfigError, match=r"^compile_cache_dir: cache is a relative path.*absolute"
    ):
        TrialConfig(compile_cache_dir="cache")
    assert TrialConfig(compile_cache_dir="~/c").compile_cache_dir == "~/c"


def test_a_runs_compile_caches_go_to_the_machine_folder_unless_the_user_set_their_own(
    monkeypatch, tmp_path
):
    from trainables.engine import compile as compile_mod

    monkeypatch.setattr(
        compile_mod, "_USER_CACHE_VARS", {k: "" for k in compile_mod._USER_CACHE_VARS}
    )
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    compile_mod.use_compile_cache(tmp_path / "a")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "a" / "inductor")
    compile_mod.use_compile_cache(tmp_path / "b")  # a resident worker's next run: its own folder
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "b" / "triton")
    monkeypatch.setitem(compile_mod._USER_CACHE_VARS, "TORCHINDUCTOR_CACHE_DIR", "/users/own")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/users/own")
    compile_mod.use_compile_cache(tmp_path / "c")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/users/own"
    # ... but not over the compile_cache_dir key, a folder asked for by name.
    compile_mod.use_compile_cache(tmp_path / "d", explicit=True)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "d" / "inductor")


def test_a_graph_kept_out_of_the_aot_autograd_cache_is_counted_with_its_reason(
    monkeypatch, tmp_path, capfd
):
    # On torch 2.11 with CUDA every graph of a compiled run bypassed AOTAutograd's cache and
    # was traced again in each process; the manifest says how many and why.
    import torch
    import torch._dynamo
    import torch._inductor.config as inductor_config

    from trainables.engine import compile as compile_mod

    monkeypatch.setattr(
        compile_mod, "_USER_CACHE_VARS", {k: "" for k in compile_mod._USER_CACHE_VARS}
    )
    compile_mod.use_compile_cache(tmp_path)
    torch._dynamo.reset()
    x = torch.randn(8, requires_grad=True)
    with inductor_config.patch(fx_graph_cache=False):  # AOTAutograd then bypasses its cache
        torch.compile(lambda t: (t * 2).sin())(x).sum().backward()
    text = compile_mod.cache_counts()
    assert "aot_autograd hit=0 miss=0 bypass=1 (FX graph cache is not enabled)" in text, text
    assert "Bypassing" not in "".join(capfd.readouterr())  # kept, not printed
    compile_mod.use_compile_cache(tmp_path)  # the next run counts from zero
    assert compile_mod.cache_counts() == ""


def _package(root: Path, name: str) -> Path:
    """A package of one module on ``root``, without bytecode."""
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text("VALUE = 42\n")
    return root / name


def test_bytecode_goes_to_the_machine_cache_only_where_it_would_be_compiled_every_time(
    monkeypatch, tmp_path
):
    import compileall
    import subprocess
    import sys

    from stage1_common.machine_cache import bytecode_env

    site = tmp_path / "site"
    bare = _package(site, "bare_pkg")
    _package(site, "built_pkg")
    compileall.compile_dir(site / "built_pkg", quiet=1)
    monkeypatch.syspath_prepend(str(site))
    cache = tmp_path / "cache"
    told = {"PYTHONDONTWRITEBYTECODE": "1", CACHE_ENV: str(cache)}
    # Bytecode is written beside the sources, or a package ships it: nothing to do.
    assert bytecode_env({CACHE_ENV: str(cache)}, ("bare_pkg",)) == {}
    assert bytecode_env(told, ("built_pkg",)) == {}
    # The user's own prefix wins.
    assert bytecode_env({**told, "PYTHONPYCACHEPREFIX": "/mine"}, ("bare_pkg",)) == {}
    env = bytecode_env(told, ("built_pkg", "bare_pkg"))
    assert env == {"PYTHONPYCACHEPREFIX": str(cache / "pycache"), "PYTHONDONTWRITEBYTECODE": ""}
    # What a process of the job then does: writes the bytecode under the machine cache, not
    # beside the source, and a later process reads it from there.
    run_env = {**os.environ, **told, **env, "PYTHONPATH": str(site)}
    code = "import bare_pkg, sys; print(bare_pkg.VALUE, sys.pycache_prefix)"
    out = subprocess.run([sys.executable, "-c", code], env=run_env, capture_output=True, text=True)
    assert out.stdout.split() == ["42", str(cache / "pycache")]
    assert not (bare / "__pycache__").exists()
    written = list((cache / "pycache").rglob("bare_pkg/__init__.*.pyc"))
    assert len(written) == 1
    # Without the change, a process told not to write bytecode leaves none anywhere.
    plain = {**os.environ, **told, "PYTHONPATH": str(site)}
    plain.pop("PYTHONPYCACHEPREFIX", None)
    subprocess.run([sys.executable, "-c", "import bare_pkg"], env=plain, check=True)
    assert not (bare / "__pycache__").exists()


def test_the_driver_keeps_its_own_later_imports_bytecode_there_and_passes_it_on(tmp_path):
    import subprocess
    import sys

    site = tmp_path / "site"
    bare = _package(site, "late_pkg")
    prefix = tmp_path / "cache" / "pycache"
    code = (
        "import os, subprocess, sys\n"
        "from stage1_common.machine_cache import keep_bytecode\n"
        f"keep_bytecode({{'PYTHONPYCACHEPREFIX': {str(prefix)!r}, 'PYTHONDONTWRITEBYTECODE': ''}})\n"
        "import late_pkg\n"  # this process, after the switch
        "child = 'import sys; print(sys.pycache_prefix, sys.flags.dont_write_bytecode)'\n"
        "print(subprocess.run([sys.executable, '-c', child], capture_output=True, text=True).stdout)"
    )
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": f"{site}:{os.getcwd()}"}
    env.pop("PYTHONPYCACHEPREFIX", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(prefix), "0"]  # a process it starts inherits it
    assert list(prefix.rglob("late_pkg/__init__.*.pyc")) and not (bare / "__pycache__").exists()
