"""``python -m data_prep.librispeech`` on a generated corpus with planted bad files, through a
real local Ray cluster: trimming accuracy, outputs, errors, rerun identity, SIGKILL and resume."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import soundfile as sf

from data_prep import synth

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration
BAD = {
    "corrupt": "cannot decode",
    "no_line": "no transcript line for this audio",
    "no_audio": "transcript line without audio",
    "silent": "all silence",
}


def prep_cmd(corpus, out, *extra):
    return [
        sys.executable,
        "-m",
        "data_prep.librispeech",
        "--input-root",
        str(corpus),
        "--output-root",
        str(out),
        "--target-sr",
        "16000",
        "--trim",
        "--manifest-path",
        str(out / "manifest_16k_trim.tsv"),
        "--log-every",
        "10",
        *extra,
    ]


def prep(corpus, out, *extra):
    return subprocess.run(
        prep_cmd(corpus, out, *extra), cwd=ROOT, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    made = synth.make_corpus(root, speakers=3, chapters=2, utts=7, seed=3)
    folder = made[0].path.parent
    spk, chap = made[0].utt_id.split("-")[:2]
    trans = folder / f"{spk}-{chap}.trans.txt"
    ids = {kind: f"{spk}-{chap}-90{i}" for i, kind in enumerate(BAD)}
    (folder / f"{ids['corrupt']}.flac").write_bytes(b"fLaC" + os.urandom(2000))
    sf.write(folder / f"{ids['no_line']}.flac", 0.1 * np.ones(16000), 16000)
    sf.write(folder / f"{ids['silent']}.flac", np.zeros(32000), 16000)
    # One good utterance as 16-bit WAV instead of FLAC.
    wav_id = f"{spk}-{chap}-0800"
    data, rate = sf.read(made[1].path)
    sf.write(folder / f"{wav_id}.wav", data, rate, subtype="PCM_16")
    with trans.open("a") as fh:
        for kind in ("corrupt", "no_audio", "silent"):
            fh.write(f"{ids[kind]} PLANTED {kind.upper()}\n")
        fh.write(f"{wav_id} A WAV FILE'S TRANSCRIPT\n")
    return root, made, ids, wav_id


@pytest.fixture(scope="module")
def first_run(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("prep") / "out"
    return out, prep(corpus[0], out)


def read_manifest(out):
    return pd.read_csv(
        out / "manifest_16k_trim.tsv",
        sep="\t",
        keep_default_na=False,
        dtype={"speaker": str, "chapter": str},
    )


def test_bad_files_are_reported_and_the_rest_is_processed(corpus, first_run):
    root, made, ids, wav_id = corpus
    out, result = first_run
    assert result.returncode == 0, result.stderr[-3000:]
    errors = pd.read_csv(out / "manifest_16k_trim.errors.tsv", sep="\t", keep_default_na=False)
    reasons = dict(zip(errors["utt_id"], errors["reason"], strict=True))
    assert set(reasons) == set(ids.values())
    for kind, fragment in BAD.items():
        assert fragment in reasons[ids[kind]], (kind, reasons[ids[kind]])
    manifest = read_manifest(out)
    assert len(manifest) == len(made) + 1
    assert list(manifest["utt_id"]) == sorted(manifest["utt_id"])
    assert f"{len(made) + 1} written, 0 skipped as done, 4 errors" in result.stderr
    assert "/" in result.stderr.splitlines()[-2] and "files/s" in result.stderr  # progress lines
    # A quiet console (issue 43 item 8): none of Ray's own lines about its actors or auth.
    for noise in ("MapWorker", "max_restarts", "Token authentication", "DeprecationWarning"):
        assert noise not in result.stdout + result.stderr, noise


def test_trimmed_durations_match_the_speech_spans(corpus, first_run):
    root, made, _, _ = corpus
    out, _ = first_run
    manifest = read_manifest(out).set_index("utt_id")
    spans = pd.read_csv(root / synth.SPANS_FILE, sep="\t").set_index("utt_id")
    joined = manifest.join(spans, how="inner", rsuffix="_src")
    assert len(joined) == len(made)
    speech = joined["speech_end_s"] - joined["speech_start_s"]
    assert ((joined["duration_s"] - speech).abs() <= 0.030).all()
    assert ((joined["trim_start_s"] - joined["speech_start_s"]).abs() <= 0.030).all()


def test_outputs_are_mono_at_the_target_rate_with_exact_transcripts(corpus, first_run):
    root, made, _, wav_id = corpus
    out, _ = first_run
    manifest = read_manifest(out).set_index("utt_id")
    for _, row in manifest.iterrows():
        data, rate = sf.read(out / row["path"], always_2d=True)
        assert rate == 16000 == row["sample_rate"] and data.shape == (row["num_samples"], 1)
        assert row["duration_s"] == pytest.approx(row["num_samples"] / 16000, abs=1e-6)
    truth = {u.utt_id: u.transcript for u in made}
    truth[wav_id] = "A WAV FILE'S TRANSCRIPT"
    assert manifest["transcript"].to_dict() == truth
    parquet = pd.read_parquet(out / "manifest_16k_trim.parquet")
    assert list(parquet["utt_id"]) == list(manifest.index) and list(parquet["transcript"]) == list(
        manifest["transcript"]
    )


def test_rerun_skips_everything_and_writes_the_same_manifest(corpus, first_run):
    out, _ = first_run
    before = (out / "manifest_16k_trim.tsv").read_bytes()
    result = prep(corpus[0], out)
    assert result.returncode == 0
    assert f"0 written, {len(corpus[1]) + 1} skipped as done" in result.stderr
    assert (out / "manifest_16k_trim.tsv").read_bytes() == before


def test_sigkill_mid_run_then_rerun_gives_the_same_manifest(corpus, first_run, tmp_path):
    out = tmp_path / "killed"
    proc = subprocess.Popen(
        prep_cmd(corpus[0], out),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list(out.rglob("*.flac"))) < 3:
        time.sleep(0.02)
    finished_before_kill = (out / "manifest_16k_trim.tsv").exists()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert not finished_before_kill, "the run ended before it could be killed"
    assert 3 <= len(list(out.rglob("*.flac"))) < len(corpus[1]) + 1
    result = prep(corpus[0], out)
    assert result.returncode == 0, result.stderr[-2000:]
    reference = (first_run[0] / "manifest_16k_trim.tsv").read_bytes()
    assert (out / "manifest_16k_trim.tsv").read_bytes() == reference
    for path in out.rglob("*.flac"):
        data, _ = sf.read(path)
        assert len(data) > 0
    assert not list(out.rglob("*.tmp"))


def test_bad_root_exits_2_with_one_line_and_writes_nothing(tmp_path):
    result = prep(tmp_path / "nope", tmp_path / "out")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "does not exist" in result.stderr
    assert not (tmp_path / "out").exists()
