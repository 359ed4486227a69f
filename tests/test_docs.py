"""Docs that users read must stay true to the code."""

import re
from pathlib import Path

from trainables.config import field_names

ROOT = Path(__file__).resolve().parent.parent


def test_architecture_key_table_lists_every_config_key():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    documented = set(re.findall(r"^\| `([a-z_0-9]+)` \|", text, flags=re.MULTILINE))
    assert documented == set(field_names())


def test_readme_quick_start_has_the_two_commands():
    text = (ROOT / "README.md").read_text()
    block = text.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = [ln for ln in block.strip().splitlines() if ln.strip()]
    assert len(lines) == 2
    assert lines[0].endswith("python -m platform.tune --space smoke")
    assert lines[1].endswith("python -m pytest")
    assert "python -m pytest" in (ROOT / ".ci" / "run").read_text()
