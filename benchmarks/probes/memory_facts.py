"""What benchmarks/probes/resident_speed_probe.py records of a process's memory (issue 24: is a
long-lived process's CPU work dearer because of how its memory is laid out?): transparent huge
pages (``AnonHugePages`` against ``Anonymous``, /proc/self/smaps_rollup), page faults per step
over a run's timed windows (the process's and its loader workers'), and glibc malloc's state
(``mallinfo2`` over every arena, and the arenas' count from ``malloc_info``); and the variants a
sequence may run before an in-process run: fixed malloc thresholds (``mallopt``), or the
process's anonymous memory advised to huge pages (``madvise``)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import tempfile
from pathlib import Path
from typing import Any

__all__ = [
    "FaultAccount",
    "advise_huge_pages",
    "fix_malloc_thresholds",
    "huge_page_env",
    "malloc_facts",
    "memory_host_facts",
    "memory_table",
    "smaps_rollup",
]

MB = 2**20
# mallopt's parameters (malloc.h) and the fixed values the ``mallopt`` step sets: large blocks
# stay in the heap (the dynamic threshold's ceiling on 64-bit), the heap's top is never trimmed
# during a run and grows 64 MB at a time, so a run neither maps nor faults in fresh pages for
# what it frees and takes again.
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
FIXED_THRESHOLDS = {M_MMAP_THRESHOLD: 32 * MB, M_TRIM_THRESHOLD: 1024 * MB, M_TOP_PAD: 64 * MB}
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25
HUGE = 2 * MB


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",  # bytes the heaps took from the system (brk and arenas' mmaps)
            "ordblks",
            "smblks",
            "hblks",  # blocks mmapped on their own (above the mmap threshold)
            "hblkhd",  # their bytes
            "usmblks",
            "fsmblks",
            "uordblks",  # bytes in use
            "fordblks",  # bytes free in the heaps
            "keepcost",
        )
    ]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def smaps_rollup(pid: int | str = "self") -> dict[str, int]:
    """The process's resident, anonymous and huge-page-backed anonymous memory, in MB."""
    keys = {"Rss": "rss_mb", "Anonymous": "anon_mb", "AnonHugePages": "anon_huge_mb"}
    out: dict[str, int] = {}
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in keys and value.split():
            out[keys[key]] = int(value.split()[0]) >> 10  # kB
    return out


def malloc_facts() -> dict[str, Any]:
    """glibc malloc's state over every arena: MB taken from the system by the heaps, MB in
    blocks mmapped on their own (and their count), MB in use and free in the heaps, and how
    many arenas there are. Empty where the C library has no ``mallinfo2`` (not glibc >= 2.33)."""
    libc = _libc()
    if not hasattr(libc, "mallinfo2"):
        return {}
    libc.mallinfo2.restype = _Mallinfo2
    m = libc.mallinfo2()
    return {
        "heap_mb": m.arena // MB,
        "mmapped_mb": m.hblkhd // MB,
        "mmapped_blocks": m.hblks,
        "in_use_mb": m.uordblks // MB,
        "free_mb": m.fordblks // MB,
        "arenas": _arena_count(libc),
    }


def _arena_count(libc: ctypes.CDLL) -> int | None:
    """The arenas ``malloc_info`` lists (one ``<heap nr=...>`` each); None where it fails."""
    if not all(hasattr(libc, f) for f in ("malloc_info", "fopen", "fclose")):
        return None
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    with tempfile.NamedTemporaryFile(suffix=".xml") as f:
        fp = libc.fopen(f.name.encode(), b"w")
        if not fp:
            return None
        libc.malloc_info(0, fp)
        libc.fclose(fp)
        return len(re.findall(r"<heap nr=", Path(f.name).read_text()))


def _faults(pid: int | str = "self") -> tuple[int, int]:
    """A process's minor and major page faults so far (/proc stat fields 10 and 12)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return int(fields[7]), int(fields[9])
    except (OSError, IndexError, ValueError):
        return 0, 0


class FaultAccount:
    """Page faults per step over a run's timed windows (the first report to the last): the
    process's minor and major faults, and the minor faults of its child processes (the
    loader's workers) alive at both ends."""

    def __init__(self) -> None:
        self._start: dict[str, Any] | None = None
        self._end: dict[str, Any] = {}

    def _now(self, step: int) -> dict[str, Any]:
        import psutil

        minor, major = _faults()
        kids = {k.pid: _faults(k.pid)[0] for k in psutil.Process().children(recursive=True)}
        return {"step": step, "minor": minor, "major": major, "kids": kids}

    def window(self, step: int) -> None:
        now = self._now(step)
        if self._start is None:
            self._start = now
        self._end = now

    def summary(self) -> dict[str, Any]:
        a, b = self._start, self._end
        if a is None or b["step"] <= a["step"]:
            return {}
        steps = b["step"] - a["step"]
        both = set(a["kids"]) & set(b["kids"])
        return {
            "minflt_per_step": round((b["minor"] - a["minor"]) / steps, 1),
            "majflt_per_step": round((b["major"] - a["major"]) / steps, 2),
            "loader_minflt_per_step": round(
                sum(b["kids"][p] - a["kids"][p] for p in both) / steps, 1
            ),
        }


def fix_malloc_thresholds() -> dict[str, int]:
    """Set FIXED_THRESHOLDS with ``mallopt`` (this also turns off glibc's dynamic mmap
    threshold); returns mallopt's answer per parameter (1: set)."""
    libc = _libc()
    names = {M_MMAP_THRESHOLD: "mmap", M_TRIM_THRESHOLD: "trim", M_TOP_PAD: "top_pad"}
    return {names[p]: libc.mallopt(p, v) for p, v in FIXED_THRESHOLDS.items()}


def advise_huge_pages() -> dict[str, int]:
    """Advise every private, writable, anonymous mapping of 2 MB or more to huge pages
    (``MADV_HUGEPAGE``: later faults take huge pages where THP is ``madvise``) and collapse what
    it holds now (``MADV_COLLAPSE``, Linux >= 6.1; pinned or busy ranges stay as they are).
    Returns the MB advised and the MB collapsed."""
    libc = _libc()
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    advised = collapsed = 0
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split()
        span, perms = parts[0], parts[1]
        path = parts[5] if len(parts) > 5 else ""
        if not perms.startswith("rw") or perms[3] != "p" or path not in ("", "[heap]"):
            continue
        lo, hi = (int(x, 16) for x in span.split("-"))
        lo, hi = -(-lo // HUGE) * HUGE, hi // HUGE * HUGE  # the whole huge pages inside
        if hi - lo < HUGE:
            continue
        if libc.madvise(lo, hi - lo, MADV_HUGEPAGE) == 0:
            advised += hi - lo
            if libc.madvise(lo, hi - lo, MADV_COLLAPSE) == 0:
                collapsed += hi - lo
    return {"advised_mb": advised // MB, "collapsed_mb": collapsed // MB}


def huge_page_env() -> dict[str, str]:
    """The environment of a fresh child whose glibc malloc advises its heaps to huge pages
    (glibc >= 2.35 reads the tunable; an older one ignores it)."""
    tunables = [t for t in os.environ.get("GLIBC_TUNABLES", "").split(":") if t]
    return dict(os.environ, GLIBC_TUNABLES=":".join([*tunables, "glibc.malloc.hugetlb=1"]))


def memory_host_facts() -> dict[str, str]:
    """The host's transparent huge page policy, and the C library."""

    def read(path: str) -> str:
        try:
            return Path(path).read_text().strip()
        except OSError:
            return ""

    thp = "/sys/kernel/mm/transparent_hugepage"
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        libc = ""
    return {
        "thp_defrag": read(f"{thp}/defrag"),
        "thp_khugepaged_defrag": read(f"{thp}/khugepaged/defrag"),
        "thp_shmem": read(f"{thp}/shmem_enabled"),
        "libc": libc,
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
    }


def memory_table(rows: list[dict[str, Any]]) -> list[str]:
    """The memory facts of a probe's runs as a Markdown table's lines."""
    out = [
        "| run | minor faults per step (process / loader) | major per step | anonymous MB, "
        "of it huge pages, at the end | malloc at start -> end: heap / mmapped / in use / "
        "free MB, arenas | variant |",
        "| --- | --- | --- | --- | --- | --- |",
    ]

    def heap(m: dict[str, Any]) -> str:
        if not m:
            return "-"
        return (
            f"{m['heap_mb']} / {m['mmapped_mb']} / {m['in_use_mb']} / {m['free_mb']}, {m['arenas']}"
        )

    for r in rows:
        smaps = r.get("smaps_end", {})
        out.append(
            f"| {r['label']} | {r.get('minflt_per_step')} / {r.get('loader_minflt_per_step')} | "
            f"{r.get('majflt_per_step')} | {smaps.get('anon_mb')}, {smaps.get('anon_huge_mb')} | "
            f"{heap(r.get('malloc_start', {}))} -> {heap(r.get('malloc_end', {}))} | "
            f"{r.get('variant', '')} |"
        )
    return out
