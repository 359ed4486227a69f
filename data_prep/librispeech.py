"""``python -m data_prep.librispeech``: LibriSpeech to a 16 kHz, silence-trimmed corpus and a
manifest, with Ray Data.

    python -m data_prep.librispeech --input-root IN --output-root OUT --target-sr 16000 --trim \\
        --manifest-path OUT/manifest_16k_trim.tsv [--workers N] [--log-every 1000] \\
        [--address ADDR] [--force]

Resumable: a rerun skips utterances whose output exists and was made with the same settings,
and writes a byte-identical manifest; ``--force`` redoes everything. Bad files go to
``<manifest stem>.errors.tsv`` and never stop the run. Exit 0 unless nothing could be processed
(1); bad arguments or a root without LibriSpeech layout exit 2 with one line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

import data_prep
import stage1_common
from data_prep.audio import TrimSettings
from data_prep.layout import Discovery, LayoutError, discover
from data_prep.pipeline import Progress, make_tasks, plan_blocks, run_ray_data, run_serial
from stage1_common.cluster import (
    alive_nodes,
    first_line,
    init_address,
    joining,
    local_auth_mode,
    node_label,
    on_every_node,
    probe_file,
    read_token,
    runtime_env,
)
from stage1_common.fileio import (
    atomic_path,
    atomic_write_text,
    ensure_writable_dir,
    remove_stale_temporaries,
    tsv_text,
)
from stage1_common.ray_address import address_problem

__all__ = [
    "ERROR_COLUMNS",
    "MANIFEST_COLUMNS",
    "MANIFEST_SCHEMA",
    "main",
    "prepare",
    "write_outputs",
]

MANIFEST_COLUMNS = [
    "utt_id",
    "path",
    "speaker",
    "chapter",
    "subset",
    "num_samples",
    "sample_rate",
    "duration_s",
    "trim_start_s",
    "trim_end_s",
    "transcript",
]
ERROR_COLUMNS = ["utt_id", "path", "reason"]
_TYPES = {
    "num_samples": pa.int64(),
    "sample_rate": pa.int32(),
    "duration_s": pa.float64(),
    "trim_start_s": pa.float64(),
    "trim_end_s": pa.float64(),
}
MANIFEST_SCHEMA = pa.schema([(c, _TYPES.get(c, pa.string())) for c in MANIFEST_COLUMNS])


class _Usage(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m data_prep.librispeech", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--input-root", type=Path, required=True, help="folder holding subset/speaker/chapter/"
    )
    p.add_argument("--output-root", type=Path, required=True, help="where the prepared corpus goes")
    p.add_argument("--target-sr", type=int, default=16_000, help="output sample rate, Hz")
    p.add_argument("--trim", action="store_true", help="cut leading and trailing silence")
    p.add_argument(
        "--top-db",
        type=float,
        default=TrimSettings.top_db,
        help="silence: this many dB below the loudest frame",
    )
    p.add_argument(
        "--trim-pad-ms",
        type=float,
        default=TrimSettings.pad_s * 1000,
        help="audio kept beyond the speech, each side",
    )
    p.add_argument(
        "--manifest-path", type=Path, help="default: OUTPUT_ROOT/manifest_<sr/1000>k[_trim].tsv"
    )
    p.add_argument(
        "--workers", type=int, help="parallel Ray Data tasks; default: the cluster's CPUs"
    )
    p.add_argument(
        "--log-every", type=int, default=1000, help="print a progress line every N files"
    )
    p.add_argument("--address", help="connect to this Ray cluster instead of starting a local one")
    p.add_argument("--force", action="store_true", help="redo every utterance, even finished ones")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        _check_args(args)
        found = discover(args.input_root)
        # The cluster answers before any folder is made.
        problem = address_problem(args.address)
        if problem:
            raise _Usage(problem)
        _check_writable(args)
    except (_Usage, LayoutError) as exc:
        print(f"data_prep.librispeech: error: {exc}", file=sys.stderr)
        return 2
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    local_auth_mode(args.address)  # before Ray is imported
    import ray

    joined = joining(args.address)
    try:
        ray.init(
            address=init_address(args.address),
            logging_level="WARNING",
            # Joining a cluster: data_prep/ and stage1_common/ travel with the job, so nodes need
            # only their dependencies; a local cluster starts without the dashboard.
            runtime_env=(
                runtime_env(ship_code=True, modules=(data_prep, stage1_common)) if joined else None
            ),
            **({} if joined else {"include_dashboard": False}),
        )
    except ConnectionError as exc:
        print(
            f"data_prep.librispeech: error: cannot reach Ray at --address {args.address} ({exc})",
            file=sys.stderr,
        )
        return 2
    try:
        if len(alive_nodes()) > 1:
            problem = check_shared_roots(args.input_root, args.output_root)
            if problem:
                print(f"data_prep.librispeech: error: {problem}", file=sys.stderr)
                return 2
        counts = prepare(
            found,
            args.input_root,
            args.output_root,
            args.manifest_path,
            target_sr=args.target_sr,
            trim=args.trim,
            settings=TrimSettings(top_db=args.top_db, pad_s=args.trim_pad_ms / 1000),
            workers=args.workers,
            force=args.force,
            log_every=args.log_every,
        )
    finally:
        ray.shutdown()
    return 0 if counts["written"] + counts["skipped"] else 1


def check_shared_roots(input_root: Path, output_root: Path) -> str | None:
    """On a cluster of several nodes, every node reads the input and writes the output: one
    task per node reads a file the driver wrote into the output root and lists the input root.
    Returns what the first node that cannot do so lacks, with the fix (None when all can)."""
    with probe_file(output_root) as (probe, token):
        answers = on_every_node(see_roots, str(Path(input_root).resolve()), probe, token)
    for node, answer in answers:
        if isinstance(answer, BaseException):
            answer = f"the node check failed there ({first_line(answer)})"
        if answer:
            return (
                f"node {node_label(node)}: {answer}; put --input-root and --output-root on "
                "storage every node mounts (NFS, a shared volume)"
            )
    return None


def see_roots(input_root: str, probe: str, token: str) -> str:
    """On one node: '' when it lists ``input_root`` and reads ``token`` from ``probe``."""
    try:
        next(iter(Path(input_root).iterdir()), None)
    except OSError as exc:
        return f"cannot read --input-root {input_root} ({exc.strerror or exc})"
    problem = read_token(probe, token)
    return f"cannot see --output-root {Path(probe).parent}: {problem}" if problem else ""


def prepare(
    found: Discovery,
    input_root: Path,
    output_root: Path,
    manifest_path: Path,
    *,
    target_sr: int = 16_000,
    trim: bool = True,
    settings: TrimSettings | None = None,
    workers: int | None = None,
    force: bool = False,
    log_every: int = 1000,
    stream=None,
    in_process: bool = False,
) -> dict[str, int]:
    """Process a discovered corpus on the connected Ray cluster and write the manifest; returns
    the counts (written / skipped / errors). Progress and the summary go to ``stream``.
    ``in_process``: one file after another in this process, no Ray (a small corpus, prepared
    before a cluster starts)."""
    stream = stream or sys.stderr
    settings = settings or TrimSettings()
    tasks = make_tasks(
        found.utterances,
        input_root,
        output_root,
        target_sr=target_sr,
        trim=trim,
        settings=settings,
        force=force,
    )
    stale = remove_stale_temporaries(output_root) if Path(output_root).is_dir() else 0
    print(
        f"{len(found.utterances)} utterances in {found.transcript_files} chapters, "
        f"{len(found.problems)} layout problems"
        + (f"; removed {stale} stale temporaries" if stale else ""),
        file=stream,
    )
    if in_process:
        workers, rows = 1, run_serial(tasks)
    else:
        import ray

        workers = plan_blocks(
            len(tasks), workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        )[1]
        rows = run_ray_data(tasks, workers) if tasks else []
    start = time.monotonic()
    progress = Progress(len(tasks), log_every, stream=stream)
    results = []
    for row in rows:
        results.append(row)
        progress.update()
    counts = write_outputs(manifest_path, output_root, found, results)
    print(
        f"done in {time.monotonic() - start:.1f} s with {workers} worker{'s' if workers != 1 else ''}: "
        f"{counts['written']} written, {counts['skipped']} skipped as done, {counts['errors']} errors"
        + (f" (see {_errors_path(manifest_path)})" if counts["errors"] else "")
        + f"; manifest {manifest_path}",
        file=stream,
    )
    return counts


def _check_args(args: argparse.Namespace) -> None:
    if args.target_sr < 1000:
        raise _Usage(f"--target-sr {args.target_sr} is not a usable rate; use e.g. 16000")
    if args.workers is not None and args.workers < 1:
        raise _Usage("--workers must be >= 1 (or left out for all CPUs)")
    if args.log_every < 1:
        raise _Usage("--log-every must be >= 1")
    if not 0 <= args.trim_pad_ms <= 1000 or args.top_db <= 0:
        raise _Usage("--trim-pad-ms must be within 0-1000 and --top-db > 0")
    if args.output_root.resolve() == args.input_root.resolve():
        raise _Usage("--output-root must differ from --input-root (outputs would replace inputs)")
    if args.manifest_path is None:
        args.manifest_path = (
            args.output_root
            / f"manifest_{args.target_sr // 1000}k{'_trim' if args.trim else ''}.tsv"
        )
    if args.manifest_path.suffix != ".tsv":
        raise _Usage(
            f"--manifest-path {args.manifest_path} must end in .tsv (the Parquet copy goes beside it)"
        )


def _check_writable(args: argparse.Namespace) -> None:
    for folder, flag in (
        (args.output_root, "--output-root"),
        (args.manifest_path.parent, "--manifest-path"),
    ):
        try:
            ensure_writable_dir(folder)
        except OSError as exc:
            raise _Usage(
                f"{flag} {folder} cannot be written ({exc.strerror or exc}); choose a writable folder"
            ) from None


def _errors_path(manifest_path: Path) -> Path:
    return manifest_path.with_name(manifest_path.stem + ".errors.tsv")


def prepare_serial(raw: Path, out: Path, *, trim: bool = True) -> Path:
    """A corpus at ``raw`` -> its 16 kHz audio and manifest at ``out``, in this process: the
    same per-file work as the Ray Data pipeline without a cluster (tests, CPU benchmarks).
    Returns the manifest's path."""
    found = discover(raw)
    tasks = make_tasks(
        found.utterances,
        raw,
        out,
        target_sr=16_000,
        trim=trim,
        settings=TrimSettings(),
        force=False,
    )
    manifest = Path(out) / "manifest_16k_trim.tsv"
    write_outputs(manifest, out, found, list(run_serial(tasks)))
    return manifest


def write_outputs(
    manifest_path: Path, output_root: Path, found: Discovery, results: list[dict]
) -> dict[str, int]:
    """The manifest (TSV and Parquet, sorted by utt_id) and errors.tsv, each written atomically."""
    by_id = {u.utt_id: u for u in found.utterances}
    rows, errors = [], list(found.problems)
    counts = {"written": 0, "skipped": 0, "errors": len(found.problems)}
    for r in results:
        u = by_id[r["utt_id"]]
        if r["status"] == "error":
            errors.append({"utt_id": u.utt_id, "path": u.audio, "reason": r["reason"]})
            counts["errors"] += 1
            continue
        counts[r["status"]] += 1
        rel = os.path.relpath(
            Path(output_root) / u.subset / u.speaker / u.chapter / f"{u.utt_id}.flac", output_root
        )
        rows.append(
            {
                "utt_id": u.utt_id,
                "path": rel,
                "speaker": u.speaker,
                "chapter": u.chapter,
                "subset": u.subset,
                "num_samples": int(r["num_samples"]),
                "sample_rate": int(r["sample_rate"]),
                "duration_s": float(r["duration_s"]),
                "trim_start_s": float(r["trim_start_s"]),
                "trim_end_s": float(r["trim_end_s"]),
                "transcript": u.transcript,
            }
        )
    rows.sort(key=lambda r: r["utt_id"])
    errors.sort(key=lambda e: (e["utt_id"], e["path"]))
    atomic_write_text(manifest_path, tsv_text(rows, MANIFEST_COLUMNS, float_format=".6f"))
    table = pa.Table.from_pylist(rows, schema=MANIFEST_SCHEMA)
    with atomic_path(manifest_path.with_suffix(".parquet")) as tmp:
        pq.write_table(table, tmp)
    atomic_write_text(_errors_path(manifest_path), tsv_text(errors, ERROR_COLUMNS))
    return counts


if __name__ == "__main__":
    sys.exit(main())
