"""README's "From an empty GPU machine to a trained model" stays true to the code.

Every ``python -m`` command of its blocks parses with its module's own argparse, and every
``--set`` key is one the code accepts. The blocks marked ``<!-- walkthrough: cpu -->`` run as
written with ``$DATA`` in a temporary folder that holds what the earlier steps leave there: the
prepared training manifest (data_prep's own per-file code) and, instead of the downloaded
weights, tiny checkpoints in the layout ``save_pretrained`` writes at the same paths. The block
marked ``<!-- walkthrough: cpu, ray -->`` (data_prep, which starts a local Ray cluster) runs as
written in an integration test, on a synthetic corpus where the download step unpacks
LibriSpeech.
"""

import importlib
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from data_prep.librispeech import prepare_serial
from tests.checkpoints import save_tiny_checkpoints
from trainables.config import field_names

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## From an empty GPU machine to a trained model"
SPACES = {"4090_mainline": 2, "4x4090_mainline": 4}  # the spaces it names, and their GPUs
TRAIN_MANIFEST = "ls16k/train/manifest_16k_trim.tsv"


def section() -> str:
    text = (ROOT / "README.md").read_text()
    return text.split(SECTION + "\n", 1)[1].split("\n## ", 1)[0]


def blocks() -> list[tuple[str, str]]:
    """(marker, code) of each bash block in order; marker is the ``walkthrough:`` comment's
    value right before the block, or ""."""
    found = re.findall(r"(?:<!-- walkthrough: ([a-z, ]+) -->\n)?```bash\n(.*?)```", section(), re.S)
    return [(marker.strip(), code) for marker, code in found]


def commands(code: str) -> list[str]:
    """The shell commands of a block: continuation lines joined, a heredoc's body left out,
    ``&&`` chains split."""
    code = re.sub(r"<<'EOF'\n.*?\nEOF\n", "\n", code, flags=re.S).replace("\\\n", " ")
    return [c.strip() for line in code.splitlines() for c in line.split("&&") if c.strip()]


def argv(command: str, data: str = "/data/stage1", space: str = "4090_mainline") -> list[str]:
    return shlex.split(command.replace("$DATA", data).replace("$SPACE", space), comments=True)


def module_commands() -> list[list[str]]:
    """Every ``python -m MODULE ...`` of the section, in its blocks and inline in its text, as
    argv, MODULE first."""
    inline = re.findall(r"`(python -m [^`]+)`", section().replace("\n", " "))
    out = []
    for command in [c for _, code in blocks() for c in commands(code)] + inline:
        words = argv(command)
        if words[:2] == ["python", "-m"] and words[2] != "pip":
            out.append(words[2:])
    return out


def sets(words: list[str]) -> list[str]:
    return [words[i + 1] for i, w in enumerate(words) if w == "--set"]


def test_the_walkthrough_goes_in_order_from_install_to_the_dashboard():
    text = section()
    steps = [
        "pip install torch --index-url https://download.pytorch.org/whl/",
        "pip install -e .",
        "https://www.openslr.org/resources/12/train-clean-100.tar.gz",
        "python -m data_prep.librispeech",
        'save_pretrained(f"{weights}/wav2vec2-base")',
        "python -m platform.tune --space",
        "--set scheduler=race",
        "python -m platform.report outputs/mainline",
        "python -m platform.train --config outputs/mainline/best_config.json",
        "ssh -L 8265:127.0.0.1:8265",
    ]
    at = [text.index(step) for step in steps]
    assert at == sorted(at)
    assert [m for m, _ in blocks() if m] == ["cpu, ray", "cpu"]


def test_every_command_parses_with_its_modules_own_arguments():
    modules = {words[0] for words in module_commands()}
    assert modules == {
        "data_prep.librispeech",
        "platform.tune",
        "platform.report",
        "platform.stability",
        "platform.train",
        "platform.grafana",
    }
    for words in module_commands():
        parser = importlib.import_module(words[0]).build_parser()
        parser.allow_abbrev = False  # the flag as the code spells it
        try:
            parser.parse_args(words[1:])
        except SystemExit:
            pytest.fail(
                f"README walkthrough: {shlex.join(['python', '-m', *words])} does not parse"
            )


def test_every_set_key_is_one_the_code_accepts():
    from platform.spaces.expand import expand_runs
    from platform.spaces.load import load_space

    text = section()
    for name, gpus in SPACES.items():
        assert f"`{name}`" in text
        space = yaml.safe_load((ROOT / "search_spaces" / f"{name}.yaml").read_text())
        assert space["resources"]["train_workers"] == gpus and space["repeats"] == 2
    for words in module_commands():
        if words[0] == "platform.tune":
            for name in SPACES:  # unknown keys raise UsageError
                expand_runs(load_space(name).with_overrides(sets(words)))
        elif words[0] == "platform.train":
            assert {s.partition("=")[0] for s in sets(words)} <= set(field_names())
    # The folders step 4 saves are the ones the sweep's keys point at.
    for key, folder in (("speech", "wav2vec2-base"), ("text", "bert-base-uncased")):
        assert f"{key}_pretrained_path" in field_names()
        assert f'{key}_pretrained_path="$DATA/weights/{folder}"' in text
        assert f'save_pretrained(f"{{weights}}/{folder}")' in text


def test_the_download_unpacks_where_data_prep_reads():
    text = section()
    subsets = re.findall(r"openslr\.org/resources/12/([a-z0-9-]+)\.tar\.gz", text)
    assert subsets == ["train-clean-100", "dev-clean", "test-clean"]
    assert f"for s in {' '.join(subsets)}; do" in text and '-C "$DATA/$s"' in text
    roots = [w[w.index("--input-root") + 1] for w in module_commands() if "--input-root" in w]
    assert roots == [f"/data/stage1/{s}/LibriSpeech" for s in subsets]


def run_blocks(marker: str, data: Path) -> str:
    """Runs the section's blocks marked MARKER as written, with $DATA and $SPACE set; what
    they printed."""
    script = "\n".join(code for m, code in blocks() if m == marker)
    env = dict(os.environ, DATA=str(data), SPACE="4090_mainline")
    if marker == "cpu":  # dry runs only: the walkthrough's machine has 2 GPUs and 32 CPUs,
        env["CUDA_VISIBLE_DEVICES"] = "0,1"  # counted as Ray would (the runs must fit them)
        env["RAY_OVERRIDE_RESOURCES"] = '{"CPU": 32}'
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def test_the_cpu_blocks_run_as_written(tmp_path):
    from data_prep import synth

    data = tmp_path / "data"
    synth.make_corpus(data / "raw", speakers=2, chapters=1, utts=3, seed=3)
    manifest = prepare_serial(data / "raw", data / Path(TRAIN_MANIFEST).parent)
    table = pd.read_csv(manifest, sep="\t", keep_default_na=False)
    transcripts = list(table["transcript"])
    # The mainline's micro-batches need 384 crops a global batch (192 x 2 workers): the six
    # utterances listed 70 times over (a dry run reads no audio; the driver checks the count).
    many = pd.concat([table.assign(utt_id=table["utt_id"] + f"-{k}") for k in range(70)])
    many.to_csv(manifest, sep="\t", index=False)
    manifest.with_suffix(".parquet").unlink()  # its Parquet copy, read first, is the old list
    speech, text = save_tiny_checkpoints(tmp_path / "ckpt", transcripts)
    (data / "weights").mkdir()
    speech.rename(data / "weights" / "wav2vec2-base")
    text.rename(data / "weights" / "bert-base-uncased")
    before = {p for p in ("outputs/mainline", "outputs/race") if (ROOT / p).exists()}

    out = run_blocks("cpu", data)

    # Both dry-runs: the mainline's 8 runs, the second as a race; nothing written.
    assert out.count("8 runs = 4 groups x 2 repeats") == 2 and "scheduler race:" in out
    assert f"manifest_path={data / TRAIN_MANIFEST}" in out
    assert {p for p in ("outputs/mainline", "outputs/race") if (ROOT / p).exists()} == before
    help_text = subprocess.run(
        [sys.executable, "-m", "platform.train", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--config CONFIG" in help_text and "--resume" in help_text


@pytest.mark.integration
def test_the_data_prep_block_runs_as_written(tmp_path):
    """data_prep as written, on a synthetic corpus where step 2 unpacks train-clean-100."""
    from data_prep import synth

    made = synth.make_corpus(
        tmp_path / "train-clean-100" / "LibriSpeech", speakers=2, chapters=1, utts=3, seed=3
    )
    out = run_blocks("cpu, ray", tmp_path)
    manifest = pd.read_csv(tmp_path / TRAIN_MANIFEST, sep="\t", keep_default_na=False)
    assert len(manifest) == len(made) and "0 errors" in out
