"""Checking a ``--address`` before ``ray.init``: for an address where nothing answers, ray.init
retries for minutes; this says so in seconds. Shared by platform.tune and data_prep (which cannot
import ``platform.*``)."""

from __future__ import annotations

import socket

__all__ = ["address_problem"]


def address_problem(address: str | None, timeout_s: float = 5.0) -> str | None:
    """Why ``address`` cannot be a Ray cluster to join, or None when something listens there.
    ``auto``/``local`` are left to Ray (it fails fast on those)."""
    if not address or address in ("auto", "local"):
        return None
    host_port = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = host_port.rpartition(":")
    host = host.strip("[]")  # [::1]:6379
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return f"{address!r} is not HOST:PORT (such as 10.0.0.5:6379 or ray://10.0.0.5:10001)"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return None
    except OSError as exc:
        return f"nothing answers at {host}:{port} ({exc.strerror or exc})"
