"""Discovery of a LibriSpeech tree: ``subset/speaker/chapter/*.flac`` (or ``.wav``) with one
``speaker-chapter.trans.txt`` per chapter. Pairs audio with transcript lines and reports what
does not pair, without opening any audio file."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["AUDIO_EXTS", "Discovery", "LayoutError", "Utterance", "discover"]

AUDIO_EXTS = (".flac", ".wav")
TRANS_SUFFIX = ".trans.txt"


class LayoutError(Exception):
    """The input root is missing or holds no LibriSpeech layout (a usage error, exit 2)."""


@dataclass(frozen=True)
class Utterance:
    utt_id: str
    subset: str
    speaker: str
    chapter: str
    audio: str  # path relative to the input root
    transcript: str


@dataclass
class Discovery:
    utterances: list[Utterance] = field(default_factory=list)
    problems: list[dict[str, str]] = field(default_factory=list)  # utt_id, path, reason
    transcript_files: int = 0


def _dirs(path: str) -> list[os.DirEntry]:
    with os.scandir(path) as it:
        return sorted(
            (e for e in it if e.is_dir() and not e.name.startswith(".")), key=lambda e: e.name
        )


def discover(input_root: Path) -> Discovery:
    root = Path(input_root)
    if not root.is_dir():
        raise LayoutError(
            f"--input-root {root} does not exist or is not a folder; pass the folder that holds the subsets (e.g. LibriSpeech/)"
        )
    found = Discovery()
    for subset in _dirs(str(root)):
        for speaker in _dirs(subset.path):
            for chapter in _dirs(speaker.path):
                _chapter(root, subset.name, speaker.name, chapter, found)
    if not found.utterances and not found.problems:
        hint = ""
        if any(p.suffix.lower() in AUDIO_EXTS for p in root.glob("*/*/*")):
            hint = " (it looks like one subset: pass its parent folder)"
        raise LayoutError(
            f"--input-root {root} holds no LibriSpeech layout (subset/speaker/chapter/*.flac with "
            f"speaker-chapter.trans.txt){hint}"
        )
    found.utterances.sort(key=lambda u: u.utt_id)
    found.problems.sort(key=lambda p: (p["utt_id"], p["path"]))
    return found


def _chapter(root: Path, subset: str, speaker: str, chapter: os.DirEntry, found: Discovery) -> None:
    audio: dict[str, str] = {}
    texts: dict[str, tuple[str, str]] = {}  # utt_id -> (transcript, transcript file)
    with os.scandir(chapter.path) as it:
        entries = sorted(
            (e for e in it if e.is_file() and not e.name.startswith(".")), key=lambda e: e.name
        )
    for entry in entries:
        rel = os.path.relpath(entry.path, root)
        if entry.name.endswith(TRANS_SUFFIX):
            found.transcript_files += 1
            _read_transcripts(entry.path, rel, texts, found)
        elif os.path.splitext(entry.name)[1].lower() in AUDIO_EXTS:
            utt_id = os.path.splitext(entry.name)[0]
            if utt_id in audio:  # both .flac and .wav: keep the first in name order (.flac)
                found.problems.append(
                    {
                        "utt_id": utt_id,
                        "path": rel,
                        "reason": f"duplicate audio; using {audio[utt_id]}",
                    }
                )
                continue
            audio[utt_id] = rel
    for utt_id, rel in audio.items():
        if utt_id not in texts:
            found.problems.append(
                {"utt_id": utt_id, "path": rel, "reason": "no transcript line for this audio"}
            )
            continue
        found.utterances.append(
            Utterance(utt_id, subset, speaker, chapter.name, rel, texts[utt_id][0])
        )
    for utt_id, (_, trans_rel) in texts.items():
        if utt_id not in audio:
            found.problems.append(
                {"utt_id": utt_id, "path": trans_rel, "reason": "transcript line without audio"}
            )


def _read_transcripts(
    path: str, rel: str, texts: dict[str, tuple[str, str]], found: Discovery
) -> None:
    try:
        content = Path(path).read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        found.problems.append(
            {"utt_id": "", "path": rel, "reason": f"unreadable transcript file: {exc}"}
        )
        return
    # Split on "\n" only: str.splitlines would also split on rare Unicode separators.
    for line in content.split("\n"):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        utt_id, _, text = line.partition(" ")
        if not text.strip():
            found.problems.append(
                {"utt_id": utt_id, "path": rel, "reason": "empty transcript line"}
            )
            continue
        texts[utt_id] = (text, rel)
