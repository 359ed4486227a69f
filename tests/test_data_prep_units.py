"""data_prep without Ray: trimming maths, per-file processing, layout discovery, synth, progress."""

import io

import numpy as np
import pytest
import soundfile as sf

from data_prep import synth
from data_prep.audio import (
    AudioError,
    TrimSettings,
    find_speech,
    process_file,
    read_prepared,
    to_rate,
)
from data_prep.layout import LayoutError, discover
from data_prep.pipeline import Progress, make_tasks, process_row, run_serial

RATE = 16_000


def burst(rate=RATE, lead=0.5, speech=1.0, trail=0.7, floor_dbfs=-90.0, seed=0):
    rng = np.random.default_rng(seed)
    n0, n1, n = int(lead * rate), int((lead + speech) * rate), int((lead + speech + trail) * rate)
    x = 10 ** (floor_dbfs / 20) * rng.standard_normal(n)
    x[n0:n1] += synth.speech_like(n1 - n0, rate, rng)
    return x.astype(np.float32), n0, n1


def test_find_speech_locates_the_speech_within_a_millisecond():
    x, n0, n1 = burst()
    start, end = find_speech(x, RATE, TrimSettings())
    assert abs(start - n0) <= RATE // 1000 and abs(end - n1) <= RATE // 1000


def test_find_speech_reports_all_silence():
    assert find_speech(np.zeros(RATE, np.float32), RATE, TrimSettings()) is None
    quiet = (1e-4 * np.random.default_rng(0).standard_normal(RATE)).astype(np.float32)  # -80 dBFS
    assert find_speech(quiet, RATE, TrimSettings()) is None


def test_a_file_louder_than_top_db_below_its_peak_is_not_trimmed():
    x, _, _ = burst(floor_dbfs=-30.0)  # the "silence" is within 60 dB of the speech
    start, end = find_speech(x, RATE, TrimSettings())
    assert start < RATE // 100 and end > len(x) - RATE // 100


def test_to_rate_is_a_no_op_at_the_target_rate_and_resamples_otherwise():
    x = np.ones(100, np.float32)
    assert to_rate(x, RATE, RATE) is x
    y = to_rate(np.zeros(44_100, np.float32), 44_100, RATE)
    assert len(y) == RATE and y.dtype == np.float32


def test_process_file_writes_mono_16k_trimmed_flac_and_can_read_it_back(tmp_path):
    x, n0, n1 = burst(rate=44_100)
    stereo = np.stack([x, 0.5 * x], axis=1)
    src, dst = tmp_path / "in.flac", tmp_path / "out" / "a.flac"
    sf.write(src, stereo, 44_100, subtype="PCM_16")
    settings = TrimSettings()
    facts = process_file(src, dst, target_sr=RATE, trim=True, settings=settings)
    data, rate = sf.read(dst, always_2d=True)
    assert rate == RATE and data.shape[1] == 1 and len(data) == facts["num_samples"]
    speech_s = (n1 - n0) / 44_100
    assert facts["duration_s"] == pytest.approx(speech_s + 2 * settings.pad_s, abs=0.003)
    assert facts["trim_start_s"] == pytest.approx(n0 / 44_100 - settings.pad_s, abs=0.002)
    assert read_prepared(dst, target_sr=RATE, trim=True, settings=settings) == facts
    # Made with other settings, or not made by us: not a finished output.
    assert read_prepared(dst, target_sr=RATE, trim=False, settings=settings) is None
    assert read_prepared(dst, target_sr=RATE, trim=True, settings=TrimSettings(top_db=50)) is None
    assert read_prepared(dst, target_sr=22_050, trim=True, settings=settings) is None
    assert read_prepared(src, target_sr=RATE, trim=True, settings=settings) is None
    dst.write_bytes(dst.read_bytes()[:100])  # truncated by something else
    assert read_prepared(dst, target_sr=RATE, trim=True, settings=settings) is None
    assert [p.name for p in dst.parent.iterdir()] == ["a.flac"]  # no temporaries left


def test_without_trim_the_whole_file_is_kept(tmp_path):
    x, _, _ = burst()
    sf.write(tmp_path / "in.wav", x, RATE, subtype="PCM_16")
    facts = process_file(tmp_path / "in.wav", tmp_path / "o.flac", target_sr=RATE, trim=False)
    assert facts["num_samples"] == len(x) and facts["trim_start_s"] == 0.0


def test_bad_audio_raises_audio_error_and_leaves_nothing(tmp_path):
    (tmp_path / "bad.flac").write_bytes(b"fLaC but not really")
    with pytest.raises(AudioError, match="cannot decode"):
        process_file(tmp_path / "bad.flac", tmp_path / "o.flac", target_sr=RATE, trim=True)
    sf.write(tmp_path / "zero.flac", np.zeros(RATE), RATE)
    with pytest.raises(AudioError, match="all silence"):
        process_file(tmp_path / "zero.flac", tmp_path / "o.flac", target_sr=RATE, trim=True)
    assert not (tmp_path / "o.flac").exists()


def write_chapter(root, lines, audio_ids, subset="dev", spk="7", chap="11", ext=".flac"):
    folder = root / subset / spk / chap
    folder.mkdir(parents=True)
    (folder / f"{spk}-{chap}.trans.txt").write_bytes("".join(lines).encode())
    for utt in audio_ids:
        sf.write(folder / f"{utt}{ext}", np.zeros(160), RATE)
    return folder


def test_discovery_pairs_audio_and_transcripts_and_reports_the_rest(tmp_path):
    write_chapter(
        tmp_path,
        [
            "7-11-0000 DON'T GO CAFÉ\r\n",
            "7-11-0001 B\n",
            "7-11-0003 NO AUDIO\n",
            "7-11-0004  \n",
            "\n",
        ],
        ["7-11-0000", "7-11-0001", "7-11-0002"],
    )
    found = discover(tmp_path)
    assert [(u.utt_id, u.transcript) for u in found.utterances] == [
        ("7-11-0000", "DON'T GO CAFÉ"),
        ("7-11-0001", "B"),
    ]
    u = found.utterances[0]
    assert (u.subset, u.speaker, u.chapter, u.audio) == (
        "dev",
        "7",
        "11",
        "dev/7/11/7-11-0000.flac",
    )
    reasons = {p["utt_id"]: p["reason"] for p in found.problems}
    assert reasons == {
        "7-11-0002": "no transcript line for this audio",
        "7-11-0003": "transcript line without audio",
        "7-11-0004": "empty transcript line",
    }


def test_discovery_accepts_wav_and_ignores_hidden_temporaries(tmp_path):
    folder = write_chapter(tmp_path, ["7-11-0000 A\n"], ["7-11-0000"], ext=".wav")
    (folder / ".7-11-0000.flac.abc.tmp").write_bytes(b"x")
    found = discover(tmp_path)
    assert [u.audio for u in found.utterances] == ["dev/7/11/7-11-0000.wav"] and not found.problems


@pytest.mark.parametrize("kind", ["missing", "empty", "subset", "flat"])
def test_discovery_refuses_roots_without_the_layout(tmp_path, kind):
    root = tmp_path / "root"
    if kind != "missing":
        root.mkdir()
    if kind == "subset":
        write_chapter(tmp_path, ["7-11-0000 A\n"], ["7-11-0000"], subset="root")
        root = tmp_path / "root"
    if kind == "flat":
        sf.write(root / "a.flac", np.zeros(160), RATE)
    with pytest.raises(LayoutError) as info:
        discover(root if kind != "subset" else root)
    message = str(info.value)
    assert "\n" not in message and "--input-root" in message
    if kind == "subset":
        assert "pass its parent folder" in message


def test_synth_corpus_is_deterministic_and_mixed(tmp_path):
    a = synth.make_corpus(tmp_path / "a", speakers=3, chapters=2, utts=6, seed=1)
    b = synth.make_corpus(tmp_path / "b", speakers=3, chapters=2, utts=6, seed=1)
    assert a[0].transcript == b[0].transcript
    assert (tmp_path / "a" / synth.SPANS_FILE).read_bytes() == (
        tmp_path / "b" / synth.SPANS_FILE
    ).read_bytes()
    assert {u.sample_rate for u in a} > {16_000} and {u.channels for u in a} == {1, 2}
    assert min(u.duration_s for u in a) >= 2.0 and max(u.duration_s for u in a) <= 20.0
    for u in a:
        info = sf.info(u.path)
        assert (info.samplerate, info.channels) == (u.sample_rate, u.channels)
        assert info.frames / info.samplerate == pytest.approx(u.duration_s, abs=1e-3)
        assert u.speech_end_s - u.speech_start_s >= 1.0
    found = discover(tmp_path / "a")
    assert len(found.utterances) == len(a) and not found.problems


def test_synth_durations_can_be_bounded(tmp_path):
    made = synth.make_corpus(
        tmp_path, speakers=1, chapters=1, utts=4, seed=2, durations=(9.0, 10.0)
    )
    assert all(9.0 <= u.duration_s <= 10.0 for u in made)
    with pytest.raises(ValueError, match="durations"):
        synth.make_corpus(tmp_path, durations=(1.0, 3.0))


def test_process_row_turns_failures_into_rows_and_serial_matches(tmp_path):
    write_chapter(tmp_path / "in", ["7-11-0000 A\n"], ["7-11-0000"])  # all zeros: silence
    found = discover(tmp_path / "in")
    tasks = make_tasks(
        found.utterances,
        tmp_path / "in",
        tmp_path / "out",
        target_sr=RATE,
        trim=True,
        settings=TrimSettings(),
        force=False,
    )
    assert tasks[0]["dst"].endswith("out/dev/7/11/7-11-0000.flac")
    row = process_row(tasks[0])
    assert row["status"] == "error" and row["reason"].startswith("all silence")
    assert list(run_serial(tasks)) == [row]


def test_progress_prints_kept_lines_every_n_files_with_rate_and_eta():
    now = [0.0]
    out = io.StringIO()
    progress = Progress(total=4, log_every=2, stream=out, clock=lambda: now[0])
    for _ in range(4):
        now[0] += 0.5
        progress.update()
    assert out.getvalue().splitlines() == [
        "2/4 files  2.0 files/s  ETA 1 s",
        "4/4 files  2.0 files/s  ETA 0 s",
    ]


@pytest.mark.parametrize(
    "n, workers, expected",
    [
        (8, 32, (1, 1)),  # a tiny corpus starts one actor, not 32
        (320, 2, (8, 2)),  # 40-row blocks, 4 per worker
        (2016, 2, (16, 2)),  # capped at 128 rows per block
        (281_241, 49, (2198, 49)),
        (40, 4, (3, 3)),  # 16-row minimum: three blocks, three actors
    ],
)
def test_plan_blocks(n, workers, expected):
    from data_prep.pipeline import plan_blocks

    assert plan_blocks(n, workers) == expected
