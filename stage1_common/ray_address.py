"""Checking a ``--address`` before ``ray.init`` and before anything is written: where nothing
answers, or where the cluster refuses this driver's token (token authentication, what
``ray start --head`` turns on by default), ray.init retries for 20 s or more, prints a line of
Ray's C++ client (gcs_client.cc) per attempt and then names the wrong cause. This asks the GCS
once, in a few seconds, and says which it is, with the fix. Shared by platform.tune/train and
data_prep (which cannot import ``platform.*``).

The GCS is asked in a child process (``python -m stage1_common.ray_address HOST:PORT``): it
imports Ray, which the driver must not do before it has set Ray's environment, and whatever Ray
or gRPC print there stays off the console. The child asks what ray.init asks first (the
cluster's id, ``NodeInfoGcsService.GetClusterId``) on a channel Ray builds itself, so it sends
the token ray.init would send (or none).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

__all__ = ["address_problem"]

RPC_TIMEOUT_S = 3.0
_PROBE_TIMEOUT_S = 60.0  # the child's imports on a loaded machine, then the RPC
_LOCAL = "or drop --address to start a local cluster"
_TOKEN_FIX = (
    "`ray get-auth-token` on its head prints the token, or read it from the head's "
    "RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH / ~/.ray/auth_token"
)


def address_problem(address: str | None, timeout_s: float = 5.0) -> str | None:
    """Why the driver cannot join the Ray cluster at ``address``, one line naming ``--address``
    and the fix; None when its GCS answered this driver (or for ``auto``/``local``, left to
    Ray, which fails fast on those). ``ray://`` (Ray Client) is checked for a listener only."""
    if not address or address in ("auto", "local"):
        return None
    client = "://" in address
    host_port = address.split("://", 1)[1] if client else address
    host, sep, port = host_port.rpartition(":")
    host = host.strip("[]")  # [::1]:6379
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return (
            f"--address {address!r} is not HOST:PORT (such as 10.0.0.5:6379 or "
            "ray://10.0.0.5:10001)"
        )
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        return (
            f"cannot reach Ray at --address {address}: nothing answers at {host}:{port} "
            f"({exc.strerror or exc}); check the address and that `ray start --head` runs "
            f"there, {_LOCAL}"
        )
    if client:
        return None
    return _explain(address, _ask_gcs(host_port))


def _ask_gcs(target: str) -> dict | None:
    """The child's answer (see _probe); None when the child itself failed (then ray.init
    decides, as before this check)."""
    root = str(Path(__file__).resolve().parent.parent)  # this checkout's stage1_common
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    )
    try:
        out = subprocess.run(
            [sys.executable, "-m", "stage1_common.ray_address", target],
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT_S,
            env=env,
        )
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, OSError, ValueError, IndexError):
        return None


def _token_source(environ: dict[str, str]) -> str:
    if environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    if environ.get("RAY_AUTH_TOKEN_PATH"):
        return f"RAY_AUTH_TOKEN_PATH {environ['RAY_AUTH_TOKEN_PATH']}"
    return "~/.ray/auth_token"


def _explain(address: str, answer: dict | None) -> str | None:
    """One line from the child's answer: ok (None), no token, token refused, no GCS there."""
    if answer is None or answer.get("code") == "OK":
        return None
    code, details = answer.get("code", ""), answer.get("details", "")
    if code == "NO_TOKEN":
        return (
            f"RAY_AUTH_MODE=token but this driver has no token to send to --address {address} "
            f"({details}; Ray reads RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH names, "
            f"else ~/.ray/auth_token); set RAY_AUTH_TOKEN to that cluster's token ({_TOKEN_FIX})"
        )
    if code == "UNAUTHENTICATED":
        if not answer.get("token_sent"):
            return (
                f"Ray at --address {address} refused this driver: the cluster uses token "
                "authentication and this driver sends no token; set RAY_AUTH_MODE=token and "
                f"RAY_AUTH_TOKEN to that cluster's token ({_TOKEN_FIX})"
            )
        return (
            f"Ray at --address {address} refused this driver's token (from "
            f"{_token_source(os.environ)}): it is not that cluster's; set RAY_AUTH_TOKEN to "
            f"that cluster's token ({_TOKEN_FIX})"
        )
    if code == "DEADLINE_EXCEEDED":
        why = f"no answer within {RPC_TIMEOUT_S:g} s"
    elif code == "UNIMPLEMENTED":
        why = "a gRPC server that is not Ray's GCS"
    elif "http" in details.lower():
        why = "an HTTP server, such as Ray's dashboard"
    else:
        why = f"{code}: {(details.splitlines() or [''])[0][:120]}"
    return (
        f"cannot reach Ray at --address {address}: something listens there but no Ray GCS "
        f"answers ({why}); give the address `ray start --head` printed (the GCS port, 6379 "
        f"unless --port chose another; not the dashboard's), {_LOCAL}"
    )


def _probe(target: str) -> dict:
    """In the child: the GCS's answer to GetClusterId as {code, details, token_sent}, after
    the token check ray.init makes (token mode and no token: NO_TOKEN, Ray's reason)."""
    import grpc
    from ray._private.grpc_utils import init_grpc_channel
    from ray._raylet import AuthenticationMode, AuthenticationTokenLoader, get_authentication_mode
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    from ray.exceptions import AuthenticationError

    token_sent = get_authentication_mode() == AuthenticationMode.TOKEN
    try:
        if token_sent and not AuthenticationTokenLoader.instance().has_token():
            raise AuthenticationError("no token found")
    except AuthenticationError as exc:  # also a RAY_AUTH_TOKEN_PATH that cannot be read
        return {"code": "NO_TOKEN", "details": exc.message.split(". ")[0], "token_sent": False}
    stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(init_grpc_channel(target))
    try:
        stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=RPC_TIMEOUT_S)
    except grpc.RpcError as exc:
        return {"code": exc.code().name, "details": exc.details() or "", "token_sent": token_sent}
    return {"code": "OK", "details": "", "token_sent": token_sent}


if __name__ == "__main__":
    print(json.dumps(_probe(sys.argv[1])), flush=True)
