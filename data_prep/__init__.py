"""Offline data preparation with Ray Data: LibriSpeech to 16 kHz with silence trimming, and a
synthetic corpus in LibriSpeech layout. Runs in Ray workers: never imports ``platform``."""

__all__: list[str] = []
