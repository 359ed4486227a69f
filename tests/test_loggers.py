"""--logger tensorboard|wandb|mlflow with the real libraries, offline, under a temporary output
root: every run becomes one series per metric, read back with each tool's own reader (TensorBoard's
event accumulator, W&B's record protobuf, MLflow's client). No Ray here; the sweep with
``--logger tensorboard`` is in tests/integration/test_smoke_sweep.py."""

import json
import struct
from pathlib import Path

import pytest

from platform.errors import UsageError
from platform.record.loggers import check_loggers, make_loggers, scalars_of
from stage1_common.output_root import OutputRoot

RUNS = {
    "sweep_z0_mb4_nw0_pf2_r1": "sweep_z0_mb4_nw0_pf2",
    "sweep_z0_mb8_nw0_pf2_r1": "sweep_z0_mb8_nw0_pf2",
}


def window(step: int, sps: float) -> dict:
    return {
        "step": step,
        "samples_per_s": sps,
        "iter_ms_p50": 100.0,
        "iter_ms_mean": 110.0,
        "data_ms_mean": 11.0,
        "loss": 2.0 - step / 100,
        "mfu": float("nan"),  # CPU: no MFU; never logged as a number
        "gpu_samples": [{"rank": 0}],  # not a scalar
    }


def tensorboard_series(folder: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []


def wandb_offline_runs(root: Path) -> dict[str, dict]:
    """Offline W&B runs under ``root/wandb``: name -> group and history, read with W&B's own
    record protobuf from its LevelDB-log-format run files (32 KiB blocks of 7-byte-headed
    records after a 7-byte file header)."""
    from wandb.proto import wandb_internal_pb2 as pb

    out = {}
    for path in sorted(root.glob("wandb/offline-run-*/run-*.wandb")):
        data, pos, chunk, name, group, history = path.read_bytes(), 7, b"", None, None, []
        while pos + 7 <= len(data):
            if 32768 - pos % 32768 < 7:
                pos += 32768 - pos % 32768
                continue
            _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
            chunk += data[pos + 7 : pos + 7 + length]
            pos += 7 + length
            if kind in (1, 4):  # a whole record, or the last piece of one
                record = pb.Record()
                record.ParseFromString(chunk)
                chunk = b""
                which = record.WhichOneof("record_type")
                if which == "run":
                    name, group = record.run.display_name, record.run.run_group
                elif which == "history":
                    items = record.history.item
                    history.append(
                        {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}
                    )
            elif kind == 0 and length == 0:
                break
        out[name] = {"group": group, "history": history}
    return out


def test_every_logger_writes_one_series_per_run_that_its_reader_finds(tmp_path):
    logs = make_loggers(["tensorboard", "wandb", "mlflow"], OutputRoot(tmp_path), echo=pytest.fail)
    assert set(logs.loggers) == {"tensorboard", "wandb", "mlflow"}
    for step in (5, 10, 15):
        for i, (run, group) in enumerate(RUNS.items()):
            logs.log(
                run,
                group,
                {"micro_batch": 4 * (i + 1)},
                step,
                scalars_of(window(step, 10.0 * (i + 1) + step)),
            )
    logs.finish("sweep_z0_mb4_nw0_pf2_r1", "ok")
    logs.close()  # the other run was still open: closed as interrupted
    expected = {run: [(s, 10.0 * (i + 1) + s) for s in (5, 10, 15)] for i, run in enumerate(RUNS)}

    for run in RUNS:
        assert (
            tensorboard_series(tmp_path / "tensorboard" / run, "perf/samples_per_s")
            == expected[run]
        )
        share = tensorboard_series(tmp_path / "tensorboard" / run, "perf/data_share")
        assert [v for _, v in share] == pytest.approx([0.1] * 3)
        assert tensorboard_series(tmp_path / "tensorboard" / run, "perf/mfu") == []

    runs = wandb_offline_runs(tmp_path)
    assert set(runs) == set(RUNS)
    for run, group in RUNS.items():
        assert runs[run]["group"] == group
        assert [(h["_step"], h["perf/samples_per_s"]) for h in runs[run]["history"]] == expected[
            run
        ]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_experiment_by_name(tmp_path.name)
    found = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert set(found) == set(RUNS)
    assert found["sweep_z0_mb4_nw0_pf2_r1"].info.status == "FINISHED"
    assert found["sweep_z0_mb8_nw0_pf2_r1"].info.status == "KILLED"
    for run, handle in found.items():
        history = client.get_metric_history(handle.info.run_id, "perf/samples_per_s")
        assert sorted((m.step, m.value) for m in history) == expected[run]
        assert handle.data.tags["group"] == RUNS[run]
        assert handle.data.params["micro_batch"] in ("4", "8")


def test_validation_at_its_step_and_checkpoint_series_when_it_is_complete():
    base = window(10, 50.0) | {"val_step": 10, "val_loss": 1.5, "checkpoint_save_s": 0.2}
    scalars = scalars_of(base, ("val_loss",))
    assert scalars["val/loss"] == 1.5 and "checkpoint/save_s" not in scalars
    assert scalars["perf/samples_per_s"] == 50.0 and "perf/mfu" not in scalars
    # An asynchronous save of step 5 whose files were whole by the window of step 10.
    later = window(10, 50.0) | {"checkpoint_step": 5, "checkpoint_save_s": 0.2}
    later["checkpoint_block_s"] = 0.01
    assert scalars_of(later | {"val_step": 5, "val_loss": 2.0}, ("val_loss",)) == pytest.approx(
        {**scalars_of(window(10, 50.0), ()), "checkpoint/save_s": 0.2, "checkpoint/block_s": 0.01}
    )


def test_unknown_logger_and_missing_package_are_refused(monkeypatch):
    with pytest.raises(
        UsageError, match="--logger neptune: unknown; choose from tensorboard, wandb, mlflow"
    ):
        check_loggers(["neptune"])
    import builtins

    real = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb":
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    with pytest.raises(
        UsageError, match="--logger wandb: the package is not installed; pip install wandb"
    ):
        check_loggers(["wandb"])
    assert check_loggers(["tensorboard", "tensorboard"]) == ["tensorboard"]
