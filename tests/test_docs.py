"""Docs that users read must stay true to the code: the keys page is generated from it, the pages
that list files, columns, variables and space keys list every one the code has, and every
relative link and anchor resolves."""

import json
import re
from pathlib import Path

import pytest

from platform.spaces.keys import REGENERATE, format_markdown
from platform.spaces.load import DATA_KEYS, RESOURCE_KEYS, SYNTH_KEYS, TOP_LEVEL_KEYS
from platform.spaces.runbook import VARIABLES
from platform.storage import results
from stage1_common.output_root import OutputRoot
from trainables.config import field_names

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# Files Ray Train writes into a run's folder: the layout page names them, not their keys.
RAY_TRAIN_FILES = ("checkpoint_manager_snapshot.json", ".validate_storage_marker")
# Every page whose links must resolve: the README, the docs, the benchmarks' and notebooks' pages.
PAGES = sorted(
    [ROOT / "README.md", ROOT / "benchmarks" / "README.md", ROOT / "notebooks" / "README.md"]
    + list(DOCS.rglob("*.md"))
)


def test_the_keys_page_is_the_generators_output():
    page = DOCS / "keys.md"
    assert page.exists() and page.read_text() == format_markdown(), (
        f"docs/keys.md differs from the config's field docs; regenerate it: {REGENERATE}"
    )


def test_the_keys_page_lists_every_config_key():
    # Every key documented, once, in a table row of its own (the generated page's tables).
    text = (DOCS / "keys.md").read_text()
    documented = re.findall(r"^\| `([a-z_0-9]+)` \|", text, flags=re.MULTILINE)
    assert sorted(documented) == sorted(field_names())


def test_readme_quick_start_has_the_two_commands():
    text = (ROOT / "README.md").read_text()
    block = text.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = [ln for ln in block.strip().splitlines() if ln.strip()]
    assert len(lines) == 2
    assert lines[0].endswith("python -m platform.tune --space smoke")
    assert lines[1].endswith("python -m pytest")
    assert "python -m pytest" in (ROOT / ".ci" / "run").read_text()


def _code_names(text: str) -> set[str]:
    """Every name a page sets in code spans (`name`, `name.ext`), and the first part of each
    path there (`runs/<run>/` names `runs`)."""
    spans = re.findall(r"`([^`\s]+)`", text)
    return {s.rstrip("/") for s in spans} | {s.split("/", 1)[0] for s in spans}


def test_the_output_layout_page_names_every_file_and_column():
    """docs/output-layout.md against the truth the integration tests hold outputs to
    (tests/data/layout_*.json) and the Parquet schemas: every file of the root, and every
    column or JSON key of each (but the config keys, which the manifest repeats)."""
    text = (DOCS / "output-layout.md").read_text()
    names = _code_names(text)
    wanted: set[str] = set()
    for record in sorted((ROOT / "tests" / "data").glob("layout_*.json")):
        for path, columns in json.loads(record.read_text()).items():
            wanted.add(path.split("/", 1)[0])
            if path.rsplit("/", 1)[-1] in RAY_TRAIN_FILES:  # named, their keys are Ray's
                wanted.add(path.rsplit("/", 1)[-1])
                continue
            wanted.update(c for c in columns if c not in field_names())
    for _, schema in results.DATASETS.values():
        wanted.update(schema.names)
    for name in vars(OutputRoot):
        value = getattr(OutputRoot, name)
        if name.isupper() and isinstance(value, str) and name not in ("SYNTH", "PREPARED"):
            wanted.add(value)
    missing = sorted(n for n in wanted if n not in names)
    assert not missing, f"docs/output-layout.md does not name: {missing}"


def test_the_runbook_page_names_every_variable():
    names = _code_names((DOCS / "migrating-from-runbooks.md").read_text())
    missing = [v for v in VARIABLES if v not in names and f"{v}=sweep" not in names]
    assert not missing, f"docs/migrating-from-runbooks.md does not name: {missing}"


def test_the_search_space_page_names_every_section_and_key():
    names = _code_names((DOCS / "search-spaces.md").read_text())
    text = (DOCS / "search-spaces.md").read_text()
    for key in (*TOP_LEVEL_KEYS, *RESOURCE_KEYS, *DATA_KEYS):
        assert key in names, key
    for key in SYNTH_KEYS:  # in the data: section's description
        assert re.search(rf"\b{key}\b", text), key


# --- links and anchors ------------------------------------------------------------------------

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def _prose(text: str) -> str:
    """The page without code (fenced blocks, blocks indented by four spaces after a blank line,
    code spans, which may run over a line break) and HTML comments: no links there."""
    text = FENCE.sub("", text)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.DOTALL)
    text = re.sub(r"(?:\n\n)((?: {4}.*(?:\n|$))+)", "\n\n", text)
    return re.sub(r"`(?:[^`\n]|\n(?!\n))*`", "", text)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: markup dropped, lower case, every character but
    letters, digits, spaces, hyphens and underscores dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"[`*]", "", text).strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a Markdown page's headings; a repeated heading gets -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return out


def _rel(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def links(page: Path) -> list[str]:
    return [m.group(1) for m in LINK.finditer(_prose(page.read_text()))]


def broken(page: Path) -> list[str]:
    """The page's relative links whose file is missing or whose #anchor is no heading there."""
    out = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            out.append(f"{target}: no such file")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            out.append(f"{target}: no heading #{anchor} in {_rel(dest)}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page):
    assert broken(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_placeholder_is_read_as_an_html_tag(page):
    """`runs/<run>/` outside code is an unknown HTML tag to GitHub, which drops it: the page
    would say runs//. Placeholders go in code spans (or as &lt;run&gt;)."""
    assert re.findall(r"<[A-Za-z][^>\n]*>", _prose(page.read_text())) == []


def test_the_link_check_finds_what_is_broken(tmp_path):
    """The checker itself: GitHub's slugs, repeated headings, code left alone."""
    assert slug("`python -m platform.tune`") == "python--m-platformtune"
    assert slug("How far to trust one run's samples/s") == "how-far-to-trust-one-runs-sampless"
    assert slug("Scheduler and search settings") == "scheduler-and-search-settings"
    (tmp_path / "other.md").write_text(
        "# Other\n\n## Part\n\n## Part\n\n```\n# not a heading\n```\n"
    )
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n[ok](other.md#part-1) [self](#page) [web](https://example.com/x#y)\n"
        "`[code](missing.md)`\n\n```\n[fenced](missing.md)\n```\n"
        "[gone](missing.md) [bad](other.md#not-a-heading) [also bad](other.md#part-2)\n"
    )
    other = _rel((tmp_path / "other.md").resolve())
    assert broken(page) == [
        "missing.md: no such file",
        f"other.md#not-a-heading: no heading #not-a-heading in {other}",
        f"other.md#part-2: no heading #part-2 in {other}",
    ]
