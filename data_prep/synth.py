"""``python -m data_prep.synth``: a small corpus in exact LibriSpeech layout, made in code.

    DIR/synth-clean/<speaker>/<chapter>/<speaker>-<chapter>-<utt>.flac
    DIR/synth-clean/<speaker>/<chapter>/<speaker>-<chapter>.trans.txt
    DIR/speech_spans.tsv        where the speech is in each file (seconds), for trim tests

Two modes:

- ``speechlike`` (default): each utterance is speech-like (voiced harmonics under moving formants,
  a syllable-rate envelope, aspiration noise) between stretches of low-level noise (-90 dBFS).
  Most files are 16 kHz mono; some are 22.05/44.1/48 kHz and some are stereo; durations spread
  over 2-20 s. The audio has no relation to its transcript: a throughput workload.
- ``learnable``: the audio is a function of the transcript, so contrastive training has something
  to learn. Every word of the vocabulary has a fixed spectral pattern (three tones of its own);
  an utterance is its words' patterns one after another, shifted in pitch and tempo per speaker,
  with a random gain and background noise. 16 kHz mono, about 1.5-4 s.

Chapters are generated in parallel (one task per chapter, all cores by default); each chapter's
random stream depends only on (seed, speaker, chapter), so the corpus is the same whatever the
number of workers.
"""

from __future__ import annotations

import argparse
import os
import sys
import zlib
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stage1_common.fileio import atomic_path, atomic_write_text, tsv_text

__all__ = ["MODES", "SynthUtterance", "make_corpus", "speech_like", "word_pattern", "main"]

MODES = ("speechlike", "learnable")
SUBSET = "synth-clean"
SPANS_FILE = "speech_spans.tsv"
SILENCE_DBFS = -90.0
RATES = (16_000, 22_050, 44_100, 48_000)
RATE_WEIGHTS = (0.7, 0.1, 0.1, 0.1)
STEREO_FRACTION = 0.15
WORDS = (
    "THE AND OF TO A IN HE THAT WAS IT HIS I WITH AS HAD FOR YOU HER SHE BUT NOT AT ON BE HIM "
    "WHICH BY SAID ALL THEY FROM SO WERE THERE ONE WOULD WHEN MY HAVE AN THIS WHO WHAT OUT UP "
    "DON'T LITTLE UPON CAPTAIN MORNING LIGHT WATER HOUSE RIVER YOUNG NIGHT WINDOW STRANGE"
).split()


@dataclass(frozen=True)
class SynthUtterance:
    utt_id: str
    path: Path
    transcript: str
    sample_rate: int
    channels: int
    duration_s: float
    speech_start_s: float
    speech_end_s: float


def speech_like(n: int, rate: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` samples of a voiced, syllabic, formant-shaped signal with 10 ms fades at both ends."""
    t = np.arange(n) / rate
    f0 = rng.uniform(95, 230) * (
        1 + 0.08 * np.sin(2 * np.pi * rng.uniform(0.3, 1.5) * t + rng.uniform(0, 6))
    )
    phase = 2 * np.pi * np.cumsum(f0) / rate
    # Three formants wandering at speech-like rates; each harmonic is weighted by its nearness.
    formants = [
        (c + d * np.sin(2 * np.pi * rng.uniform(1, 4) * t + rng.uniform(0, 6)), bw)
        for c, d, bw in ((550, 250, 90), (1500, 600, 120), (2600, 300, 160))
    ]
    top = min(4000.0, rate / 2 - 500)
    signal = np.zeros(n)
    for k in range(1, int(top // f0.max()) + 1):
        freq = k * f0
        gain = sum(1.0 / (1.0 + ((freq - fc) / bw) ** 2) for fc, bw in formants)
        signal += gain * np.sin(k * phase) / np.sqrt(k)
    syllable = 0.5 - 0.5 * np.cos(2 * np.pi * rng.uniform(3, 6) * t + rng.uniform(0, 6))
    signal *= 0.25 + 0.75 * syllable  # never silent inside the span
    signal += 0.03 * rng.standard_normal(n) * syllable  # aspiration
    fade = min(n // 2, int(0.010 * rate))
    ramp = 0.5 - 0.5 * np.cos(np.pi * np.arange(fade) / fade)
    signal[:fade] *= ramp
    signal[n - fade :] *= ramp[::-1]
    peak_dbfs = rng.uniform(-12, -3)
    return signal / np.abs(signal).max() * 10 ** (peak_dbfs / 20)


def _utterance(
    rng: np.random.Generator, utt_id: str, path: Path, durations: tuple[float, float]
) -> tuple[SynthUtterance, np.ndarray]:
    rate = int(rng.choice(RATES, p=RATE_WEIGHTS))
    channels = 2 if rng.random() < STEREO_FRACTION else 1
    duration = rng.uniform(*durations)
    edge = min(1.5, (duration - 1.0) / 2)  # keep at least 1 s of speech
    lead, trail = rng.uniform(0.2, edge), rng.uniform(0.2, edge)
    n = int(round(duration * rate))
    start, end = int(round(lead * rate)), n - int(round(trail * rate))
    floor = 10 ** (SILENCE_DBFS / 20)
    speech = speech_like(end - start, rate, rng)
    audio = floor * rng.standard_normal((n, channels))
    for ch in range(channels):
        audio[start:end, ch] += speech * (1.0 if ch == 0 else rng.uniform(0.6, 0.9))
    words = rng.choice(WORDS, size=int(rng.integers(3, 26)))
    utt = SynthUtterance(
        utt_id=utt_id,
        path=path,
        transcript=" ".join(words),
        sample_rate=rate,
        channels=channels,
        duration_s=n / rate,
        speech_start_s=start / rate,
        speech_end_s=end / rate,
    )
    return utt, audio.astype(np.float32)


# Learnable mode: each word is three tones of its own, spread over 250-3800 Hz on a log scale.
_PATTERN_LOW_HZ, _PATTERN_HIGH_HZ, _PATTERN_TONES = 250.0, 3800.0, 3
LEARNABLE_RATE = 16_000


def word_pattern(word: str) -> np.ndarray:
    """The fixed tone frequencies (Hz) of ``word``: the same in every process and run (from a
    CRC of the word, not Python's salted hash)."""
    rng = np.random.default_rng(zlib.crc32(word.encode()))
    return np.sort(
        np.exp(rng.uniform(np.log(_PATTERN_LOW_HZ), np.log(_PATTERN_HIGH_HZ), _PATTERN_TONES))
    )


def _learnable_audio(
    words: list[str], rng: np.random.Generator, pitch: float, tempo: float, rate: int
) -> np.ndarray:
    """The words' patterns in order, each 0.16-0.24 s (scaled by the speaker's tempo) with a
    raised-cosine envelope, and 20-60 ms pauses between them."""
    parts = []
    for word in words:
        n = int(rate * tempo * rng.uniform(0.16, 0.24))
        t = np.arange(n) / rate
        tones = word_pattern(word) * pitch * rng.uniform(0.98, 1.02)
        seg = sum(np.sin(2 * np.pi * f * t + rng.uniform(0, 6.3)) for f in tones)
        parts.append(seg * np.hanning(n) * rng.uniform(0.6, 1.0))
        parts.append(np.zeros(int(rate * rng.uniform(0.02, 0.06))))
    return np.concatenate(parts[:-1])


def _speaker_voice(seed: int, speaker_index: int) -> tuple[float, float]:
    """A speaker's pitch factor and tempo, fixed for all its utterances."""
    rng = np.random.default_rng([seed, speaker_index, 7])
    return float(rng.uniform(0.95, 1.05)), float(rng.uniform(0.85, 1.15))


def _learnable_utterance(
    rng: np.random.Generator, utt_id: str, path: Path, voice: tuple[float, float]
) -> tuple[SynthUtterance, np.ndarray]:
    rate = LEARNABLE_RATE
    words = [str(w) for w in rng.choice(WORDS, size=int(rng.integers(3, 7)))]
    speech = _learnable_audio(words, rng, *voice, rate)
    speech *= 10 ** (rng.uniform(-12, -3) / 20) / max(np.abs(speech).max(), 1e-9)
    lead, trail = (int(rate * rng.uniform(0.15, 0.4)) for _ in range(2))
    n = lead + len(speech) + trail
    # Background noise 25-35 dB below the speech's peak, and the -90 dBFS floor outside it.
    noise_db = rng.uniform(-35, -25) + 20 * np.log10(np.abs(speech).max())
    audio = 10 ** (SILENCE_DBFS / 20) * rng.standard_normal(n)
    audio[lead : lead + len(speech)] += speech + 10 ** (noise_db / 20) * rng.standard_normal(
        len(speech)
    )
    utt = SynthUtterance(
        utt_id=utt_id,
        path=path,
        transcript=" ".join(words),
        sample_rate=rate,
        channels=1,
        duration_s=n / rate,
        speech_start_s=lead / rate,
        speech_end_s=(lead + len(speech)) / rate,
    )
    return utt, audio.astype(np.float32)[:, None]


def _chapter(task: dict) -> list[SynthUtterance]:
    """Write one chapter folder (audio and transcript file); a process-pool task."""
    import soundfile as sf

    seed, s, c = task["seed"], task["speaker_index"], task["chapter_index"]
    speaker, chapter = task["speaker"], task["chapter"]
    folder = Path(task["root"]) / SUBSET / speaker / chapter
    rng = np.random.default_rng([seed, s, c])
    voice = _speaker_voice(seed, s)
    lines, made = [], []
    for u in range(task["utts"]):
        utt_id = f"{speaker}-{chapter}-{u:04d}"
        path = folder / f"{utt_id}.flac"
        if task["mode"] == "learnable":
            utt, audio = _learnable_utterance(rng, utt_id, path, voice)
        else:
            utt, audio = _utterance(rng, utt_id, path, task["durations"])
        with atomic_path(utt.path, durable=False) as tmp:
            sf.write(str(tmp), audio, utt.sample_rate, format="FLAC", subtype="PCM_16")
        lines.append(f"{utt_id} {utt.transcript}\n")
        made.append(utt)
    atomic_write_text(folder / f"{speaker}-{chapter}.trans.txt", "".join(lines))
    return made


def make_corpus(
    output_root: Path,
    *,
    speakers: int = 4,
    chapters: int = 2,
    utts: int = 10,
    seed: int = 0,
    durations: tuple[float, float] = (2.0, 20.0),
    mode: str = "speechlike",
    workers: int | None = None,
) -> list[SynthUtterance]:
    """Write the corpus and its speech spans; the same seed (and mode) always gives the same
    corpus, whatever ``workers`` is (default: every core; small corpora stay in this process).
    ``durations`` bounds the uniform file length in seconds (at least 2 s; speechlike mode)."""
    if not 2.0 <= durations[0] <= durations[1]:
        raise ValueError(f"durations must satisfy 2 <= min <= max, got {durations}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    output_root = Path(output_root)
    tasks = [
        {
            "root": str(output_root),
            "seed": seed,
            "speaker_index": s,
            "chapter_index": c,
            "speaker": str(100 + 37 * s + seed % 37),
            "chapter": str(1000 + 113 * c + 7 * s),
            "utts": utts,
            "durations": durations,
            "mode": mode,
        }
        for s in range(speakers)
        for c in range(chapters)
    ]
    workers = min(workers or os.cpu_count() or 1, len(tasks))
    if workers <= 1 or speakers * chapters * utts < 64:
        chunks = [_chapter(t) for t in tasks]
    else:
        # spawn: the caller may hold threads (a Ray driver) that a fork would copy half-way.
        import multiprocessing

        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            chunks = list(pool.map(_chapter, tasks))
    made = [u for chunk in chunks for u in chunk]
    columns = ["utt_id", "speech_start_s", "speech_end_s", "duration_s", "sample_rate", "channels"]
    spans = [{k: getattr(u, k) for k in columns} for u in made]
    atomic_write_text(output_root / SPANS_FILE, tsv_text(spans, columns, float_format=".6f"))
    return made


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m data_prep.synth", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--output-root", type=Path, required=True)
    p.add_argument("--speakers", type=int, default=4)
    p.add_argument("--chapters", type=int, default=2, help="chapters per speaker")
    p.add_argument("--utts", type=int, default=10, help="utterances per chapter")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-s", type=float, default=2.0, help="shortest file, seconds (>= 2)")
    p.add_argument("--max-s", type=float, default=20.0, help="longest file, seconds")
    p.add_argument(
        "--mode",
        default="speechlike",
        help="speechlike (audio unrelated to the text) or learnable (audio spells the words)",
    )
    p.add_argument("--workers", type=int, default=0, help="processes (default: every core)")
    args = p.parse_args(argv)
    if not 2.0 <= args.min_s <= args.max_s:
        print("data_prep.synth: error: need 2 <= --min-s <= --max-s", file=sys.stderr)
        return 2
    for name in ("speakers", "chapters", "utts"):
        if getattr(args, name) < 1:
            print(f"data_prep.synth: error: --{name} must be >= 1", file=sys.stderr)
            return 2
    if args.mode not in MODES or args.workers < 0:
        print(
            f"data_prep.synth: error: --mode must be one of {', '.join(MODES)} and --workers "
            f">= 0, got {args.mode!r} and {args.workers}",
            file=sys.stderr,
        )
        return 2
    made = make_corpus(
        args.output_root,
        speakers=args.speakers,
        chapters=args.chapters,
        utts=args.utts,
        seed=args.seed,
        durations=(args.min_s, args.max_s),
        mode=args.mode,
        workers=args.workers or None,
    )
    hours = sum(u.duration_s for u in made) / 3600
    print(
        f"wrote {len(made)} utterances ({hours:.2f} h of audio) under {args.output_root / SUBSET}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
