"""Runs in a multiprocessing spawn child: the imports the driver relies on must work there too."""


def probe(_: int = 0) -> dict:
    import pickle

    import pandas  # noqa: F401
    import ray  # noqa: F401
    import torch  # noqa: F401

    import platform

    uname = platform.uname()
    return {
        "system": platform.system(),
        "uname": pickle.dumps(uname),
        "platform_file": platform.__file__,
    }
