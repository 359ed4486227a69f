"""Driver side of the stage-1 platform, and the standard library's ``platform`` module.

Run from the repository root (``python -m platform.tune``, ``python -m pytest``), this package is
found before the standard library's ``platform.py`` and so replaces it for the whole process.
torch, ray, pandas and uuid call ``platform.system()`` and friends at import, so this file loads
the standard module from the interpreter's stdlib directory and re-exports its whole namespace. It
must hold nothing else. Ray worker processes never see this package (they import the standard
module before the project directory is on their path), so code that runs in a worker lives in
``trainables/`` or ``data_prep/``.
"""

import importlib.util as _importlib_util
import os as _os
import sysconfig as _sysconfig


def _load_stdlib_platform():
    path = _os.path.join(_sysconfig.get_paths()["stdlib"], "platform.py")
    # Executed under the name "platform" so that its classes (uname_result) pickle as
    # ``platform.uname_result`` and unpickle in any process, ours or a plain interpreter.
    spec = _importlib_util.spec_from_file_location("platform", path)
    module = _importlib_util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_stdlib = _load_stdlib_platform()
globals().update(
    {
        name: value
        for name, value in vars(_stdlib).items()
        if name
        not in {
            "__name__",
            "__file__",
            "__spec__",
            "__loader__",
            "__package__",
            "__path__",
            "__cached__",
            "__builtins__",
            "__doc__",
        }
    }
)
del _load_stdlib_platform
