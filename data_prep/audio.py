"""Per-file audio work: decode, downmix, resample, trim silence, write 16-bit FLAC.

Pure functions of numpy arrays plus two file helpers; the Ray Data pipeline and the
single-process benchmark loop both call :func:`process_file`, so they do exactly the same work.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stage1_common.fileio import atomic_path

__all__ = [
    "AudioError",
    "TrimSettings",
    "find_speech",
    "load_mono",
    "process_file",
    "read_prepared",
    "to_rate",
]

_TAG = "stage1-data-prep/1"


class AudioError(Exception):
    """A file that cannot become a training utterance; the message is its errors.tsv reason."""


@dataclass(frozen=True)
class TrimSettings:
    """Silence detection like librosa's ``effects.trim(top_db=60)``, on short frames.

    A frame is speech when its RMS is within ``top_db`` of the file's loudest frame; the kept
    region runs from the first to the last speech sample, plus ``pad_s`` each side. A file
    whose loudest frame is below ``silence_dbfs`` is all silence.
    """

    top_db: float = 60.0
    silence_dbfs: float = -60.0
    pad_s: float = 0.01
    frame_s: float = 0.005
    hop_s: float = 0.0025


def load_mono(path: Path) -> tuple[np.ndarray, int]:
    """Decode with soundfile and average the channels; float32 in [-1, 1]."""
    import soundfile as sf

    try:
        data, rate = sf.read(str(path), dtype="float32", always_2d=True)
    except Exception as exc:  # libsndfile raises its own types for every kind of bad file
        raise AudioError(f"cannot decode: {exc}") from None
    if data.shape[0] == 0:
        raise AudioError("empty audio (0 samples)")
    mono = data[:, 0] if data.shape[1] == 1 else data.mean(axis=1, dtype=np.float32)
    return np.ascontiguousarray(mono), int(rate)


def to_rate(x: np.ndarray, rate: int, target: int) -> np.ndarray:
    """soxr resampling at high quality; no work when already at the target rate."""
    if rate == target:
        return x
    import soxr

    return soxr.resample(x, rate, target, quality="HQ").astype(np.float32, copy=False)


def find_speech(x: np.ndarray, rate: int, settings: TrimSettings) -> tuple[int, int] | None:
    """[start, end) sample range from the first to the last speech sample, or None if the
    file is all silence."""
    frame = max(1, round(settings.frame_s * rate))
    hop = max(1, round(settings.hop_s * rate))
    energy = np.concatenate([[0.0], np.cumsum(np.square(x, dtype=np.float64))])
    if len(x) <= frame:
        starts = np.array([0])
        rms = np.sqrt(np.array([energy[-1] / max(1, len(x))]))
    else:
        starts = np.arange(0, len(x) - frame + 1, hop)
        rms = np.sqrt((energy[starts + frame] - energy[starts]) / frame)
    peak = float(rms.max())
    if peak <= 10 ** (settings.silence_dbfs / 20):
        return None
    threshold = peak * 10 ** (-settings.top_db / 20)
    loud = np.flatnonzero(rms > threshold)
    first, last = starts[loud[0]], starts[loud[-1]]
    # Refine to samples inside the boundary frames: a frame whose RMS exceeds the threshold
    # holds at least one sample that does, so both searches always find one.
    head = np.flatnonzero(np.abs(x[first : first + frame]) > threshold)
    tail = np.flatnonzero(np.abs(x[last : last + frame]) > threshold)
    return int(first + head[0]), int(last + tail[-1] + 1)


def _comment(
    target_sr: int, trim: bool, settings: TrimSettings, start_s: float, end_s: float
) -> str:
    return (
        f"{_TAG} target_sr={target_sr} trim={int(trim)} top_db={settings.top_db:g} "
        f"pad_s={settings.pad_s:g} silence_dbfs={settings.silence_dbfs:g} "
        f"trim_start_s={start_s:.6f} trim_end_s={end_s:.6f}"
    )


def process_file(
    src: Path, dst: Path, *, target_sr: int, trim: bool, settings: TrimSettings = TrimSettings()
) -> dict:
    """Decode ``src``, write the prepared utterance to ``dst`` (atomically), return its facts.

    The settings and trim offsets are stored in the FLAC's comment, so a later run can tell a
    finished output from a stale one and rebuild its manifest row without decoding it.
    """
    import soundfile as sf

    x, rate = load_mono(src)
    x = to_rate(x, rate, target_sr)
    span = find_speech(x, target_sr, settings)
    if span is None:
        raise AudioError(f"all silence (loudest frame below {settings.silence_dbfs:g} dBFS)")
    if trim:
        pad = round(settings.pad_s * target_sr)
        start, end = max(0, span[0] - pad), min(len(x), span[1] + pad)
    else:
        start, end = 0, len(x)
    y = np.clip(x[start:end], -1.0, 32767 / 32768)  # float -> PCM_16 would wrap, not clip
    start_s, end_s = start / target_sr, end / target_sr
    with atomic_path(dst, durable=False) as tmp:
        with sf.SoundFile(
            str(tmp), "w", samplerate=target_sr, channels=1, format="FLAC", subtype="PCM_16"
        ) as out:
            out.comment = _comment(target_sr, trim, settings, start_s, end_s)
            out.write(y)
    return _facts(len(y), target_sr, start_s, end_s)


def read_prepared(dst: Path, *, target_sr: int, trim: bool, settings: TrimSettings) -> dict | None:
    """The facts of an existing output if it was made with these settings, else None."""
    import soundfile as sf

    try:
        with sf.SoundFile(str(dst)) as f:
            comment, frames, rate = f.comment, f.frames, f.samplerate
    except Exception:
        return None
    fields = dict(part.split("=", 1) for part in comment.split()[1:] if "=" in part)
    if not comment.startswith(_TAG) or rate != target_sr or frames <= 0:
        return None
    expected = _comment(target_sr, trim, settings, 0.0, 0.0).split()
    for part in expected[1:]:
        key, value = part.split("=", 1)
        if key.startswith("trim_") and key != "trim":
            continue
        if fields.get(key) != value:
            return None
    try:
        start_s, end_s = float(fields["trim_start_s"]), float(fields["trim_end_s"])
    except (KeyError, ValueError):
        return None
    return _facts(frames, rate, start_s, end_s)


def _facts(num_samples: int, rate: int, start_s: float, end_s: float) -> dict:
    return {
        "num_samples": int(num_samples),
        "sample_rate": int(rate),
        "duration_s": round(num_samples / rate, 6),
        "trim_start_s": round(start_s, 6),
        "trim_end_s": round(end_s, 6),
    }
