"""``python -m data_prep.synth``: a small corpus in exact LibriSpeech layout, made in code.

    DIR/synth-clean/<speaker>/<chapter>/<speaker>-<chapter>-<utt>.flac
    DIR/synth-clean/<speaker>/<chapter>/<speaker>-<chapter>.trans.txt
    DIR/speech_spans.tsv        where the speech is in each file (seconds), for trim tests

Each utterance is speech-like (voiced harmonics under moving formants, a syllable-rate envelope,
aspiration noise) between stretches of low-level noise (-90 dBFS). Most files are 16 kHz mono;
some are 22.05/44.1/48 kHz and some are stereo; durations spread over 2-20 s.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data_prep.fileio import atomic_path, atomic_write_text, tsv_text

__all__ = ["SynthUtterance", "make_corpus", "speech_like", "main"]

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


def make_corpus(
    output_root: Path,
    *,
    speakers: int = 4,
    chapters: int = 2,
    utts: int = 10,
    seed: int = 0,
    durations: tuple[float, float] = (2.0, 20.0),
) -> list[SynthUtterance]:
    """Write the corpus and its speech spans; the same seed always gives the same corpus.
    ``durations`` bounds the uniform file length in seconds (at least 2 s)."""
    if not 2.0 <= durations[0] <= durations[1]:
        raise ValueError(f"durations must satisfy 2 <= min <= max, got {durations}")
    import soundfile as sf

    output_root = Path(output_root)
    rng = np.random.default_rng(seed)
    made: list[SynthUtterance] = []
    for s in range(speakers):
        speaker = str(100 + 37 * s + seed % 37)
        for c in range(chapters):
            chapter = str(1000 + 113 * c + 7 * s)
            folder = output_root / SUBSET / speaker / chapter
            lines = []
            for u in range(utts):
                utt_id = f"{speaker}-{chapter}-{u:04d}"
                utt, audio = _utterance(rng, utt_id, folder / f"{utt_id}.flac", durations)
                with atomic_path(utt.path, durable=False) as tmp:
                    sf.write(str(tmp), audio, utt.sample_rate, format="FLAC", subtype="PCM_16")
                lines.append(f"{utt_id} {utt.transcript}\n")
                made.append(utt)
            atomic_write_text(folder / f"{speaker}-{chapter}.trans.txt", "".join(lines))
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
    args = p.parse_args(argv)
    if not 2.0 <= args.min_s <= args.max_s:
        print("data_prep.synth: error: need 2 <= --min-s <= --max-s", file=sys.stderr)
        return 2
    for name in ("speakers", "chapters", "utts"):
        if getattr(args, name) < 1:
            print(f"data_prep.synth: error: --{name} must be >= 1", file=sys.stderr)
            return 2
    made = make_corpus(
        args.output_root,
        speakers=args.speakers,
        chapters=args.chapters,
        utts=args.utts,
        seed=args.seed,
        durations=(args.min_s, args.max_s),
    )
    hours = sum(u.duration_s for u in made) / 3600
    print(
        f"wrote {len(made)} utterances ({hours:.2f} h of audio) under {args.output_root / SUBSET}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
