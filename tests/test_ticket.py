"""A run's ticket across the Ray boundary (trainables/ticket.py): encoded to plain JSON-able
values and decoded back to an equal ticket, its storage as the driver's output root says it
(a folder, or a bucket with the nodes' scratch folder), one spelling of "on a bucket"."""

import json
import pickle
from pathlib import Path

import pytest

from stage1_common.output_root import OutputRoot
from trainables.config import TrialConfig
from trainables.ticket import GroupTicket, RunStorage, RunTicket


def ticket(storage: RunStorage, **values) -> RunTicket:
    config = TrialConfig(
        use_gpu=False,
        micro_batch=4,
        dataset="manifest",
        manifest_path="/data/m.tsv",
        crop_policy="limit_longest",
        crop_buckets_s="3,1.50,2",
    )
    name, group = "sweep_z0_mb4_nw0_pf2_r1", "z0_mb4"
    return RunTicket(name=name, group=group, repeat=1, storage=storage, config=config, **values)


def test_a_ticket_encodes_to_plain_values_and_decodes_to_an_equal_ticket(tmp_path):
    storage = RunStorage.of(OutputRoot(tmp_path / "root"))
    assert storage == RunStorage(
        runs=str(tmp_path / "root" / "runs"), groups=str(tmp_path / "root" / "tune" / "groups")
    )
    assert not storage.on_bucket
    resident = ticket(storage, pool="stage1-groups-1", group_cpus=9)
    for original in (ticket(storage), resident, resident.started(1234.5)):
        encoded = original.encode()
        # Plain values: Tune's param space (and its experiment state) takes them as they are.
        assert json.loads(json.dumps(encoded)) == encoded
        decoded = RunTicket.decode(json.loads(json.dumps(encoded)))
        assert decoded == original
        assert decoded.config.micro_batch == 4 and decoded.config.crop_buckets_s == "1.5,2,3"
        assert RunTicket.name_in(encoded) == original.name
        # Inside the resident protocol the object itself travels (Ray pickles it).
        assert pickle.loads(pickle.dumps(original)) == original
    assert resident.start_ts is None and resident.started(1234.5).start_ts == 1234.5


def test_a_bucket_root_keeps_its_scratch_folder_through_encode_and_decode(tmp_path):
    staged = tmp_path / "stage1-staging-abc"
    root = OutputRoot(staged, remote="s3://sweeps/prefix/sweep?endpoint_override=localhost:9000")
    storage = RunStorage.of(root)
    assert storage.on_bucket and storage.scratch == "stage1-staging-abc"
    assert storage.runs == "s3://sweeps/prefix/sweep/runs?endpoint_override=localhost:9000"
    assert storage.groups == "s3://sweeps/prefix/sweep/tune/groups?endpoint_override=localhost:9000"
    decoded = RunTicket.decode(json.loads(json.dumps(ticket(storage).encode())))
    assert decoded.storage == storage and decoded.storage.on_bucket


def test_a_storage_whose_scratch_and_root_disagree_is_refused():
    with pytest.raises(ValueError, match="scratch folder goes with a root on object storage"):
        RunStorage(runs="/data/root/runs", groups="/data/root/tune/groups", scratch="x")
    with pytest.raises(ValueError, match="scratch folder goes with a root on object storage"):
        RunStorage(runs="s3://b/root/runs", groups="s3://b/root/tune/groups")


def test_a_decoded_ticket_validates_its_config_and_names_a_wrong_key(tmp_path):
    encoded = ticket(RunStorage.of(OutputRoot(Path(tmp_path)))).encode()
    encoded["run"]["config"]["micro_batchh"] = 8
    with pytest.raises(Exception, match="micro_batch"):
        RunTicket.decode(encoded)


def test_a_group_ticket_round_trips():
    group = GroupTicket(pool="stage1-groups-1", group="g2", cpus=9)
    encoded = group.encode()
    assert json.loads(json.dumps(encoded)) == encoded
    assert GroupTicket.decode(encoded) == group
