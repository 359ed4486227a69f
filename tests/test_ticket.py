"""A run's ticket across the Ray boundary (trainables/ticket.py): encoded to plain JSON-able
values and decoded back to an equal ticket, its storage of the kind the driver chose for its
output root (platform/storage/mirror.py: a folder, or a bucket with the nodes' scratch folder)
and decoded as that kind, whose place answers for a run's files (trainables/run_folder/place.py)."""

import json
import pickle
from pathlib import Path

import pytest

from platform.storage.mirror import run_storage
from stage1_common.output_root import OutputRoot
from trainables.config import TrialConfig
from trainables.run_folder.place import InBucket, InFolder
from trainables.ticket import GroupTicket, RunsInBucket, RunsInFolder, RunStorage, RunTicket


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
    storage = run_storage(OutputRoot(tmp_path / "root"))
    assert storage == RunsInFolder(
        runs=str(tmp_path / "root" / "runs"), groups=str(tmp_path / "root" / "tune" / "groups")
    )
    place = storage.place("r1")
    assert isinstance(place, InFolder) and place.folder == tmp_path / "root" / "runs" / "r1"
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
    storage = run_storage(root)
    assert isinstance(storage, RunsInBucket) and storage.scratch == "stage1-staging-abc"
    assert storage.runs == "s3://sweeps/prefix/sweep/runs?endpoint_override=localhost:9000"
    assert storage.groups == "s3://sweeps/prefix/sweep/tune/groups?endpoint_override=localhost:9000"
    decoded = RunTicket.decode(json.loads(json.dumps(ticket(storage).encode())))
    assert decoded.storage == storage and isinstance(decoded.storage, RunsInBucket)
    # A folder's storage with the same fields is not equal: the kind is the driver's answer.
    assert RunsInFolder(runs=storage.runs, groups=storage.groups) != RunsInBucket(
        runs=storage.runs, groups=storage.groups, scratch=storage.scratch
    )


def test_a_bucket_storage_names_its_scratch_folder_and_a_folder_storage_has_none():
    with pytest.raises(ValueError, match="without a scratch folder"):
        RunsInBucket(runs="s3://b/root/runs", groups="s3://b/root/tune/groups", scratch="")
    with pytest.raises(TypeError):
        RunsInFolder(runs="/data/root/runs", groups="/data/root/tune/groups", scratch="x")
    with pytest.raises(TypeError):  # a storage of no kind: the driver always chooses one
        RunStorage(runs="/data/root/runs", groups="/data/root/tune/groups")


def test_each_kind_of_storage_gives_its_place_of_a_run(tmp_path):
    """The place a worker's run files get is the storage's answer: its folder every node
    mounts, or this node's scratch copy under the sweep's scratch folder and the run's folder
    in the bucket (its region named: nothing is asked of the store to build it)."""
    here = RunsInFolder(runs=str(tmp_path / "runs"), groups=str(tmp_path / "g")).place("r1")
    assert isinstance(here, InFolder) and here.folder == tmp_path / "runs" / "r1"
    runs = "s3://b/root/runs?region=us-east-1"
    there = RunsInBucket(runs=runs, groups="s3://b/root/tune/groups", scratch="x").place("r1")
    assert isinstance(there, InBucket)
    assert there.folder.parts[-5] == "stage1-scratch" and there.folder.parts[-4] == "x"
    assert there.folder.parts[-2:] == ("runs", "r1")
    assert there.in_bucket.uri == "s3://b/root/runs/r1?region=us-east-1"


def test_a_decoded_ticket_validates_its_config_and_names_a_wrong_key(tmp_path):
    encoded = ticket(run_storage(OutputRoot(Path(tmp_path)))).encode()
    encoded["run"]["config"]["micro_batchh"] = 8
    with pytest.raises(Exception, match="micro_batch"):
        RunTicket.decode(encoded)


def test_a_group_ticket_round_trips():
    group = GroupTicket(pool="stage1-groups-1", group="g2", cpus=9)
    encoded = group.encode()
    assert json.loads(json.dumps(encoded)) == encoded
    assert GroupTicket.decode(encoded) == group
