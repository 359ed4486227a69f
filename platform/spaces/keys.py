"""The config keys as users read them: each key's family, type, default and doc (``python -m
platform.tune --keys [PATTERN]``), the same as a Markdown page (docs/keys.md: ``python -m
platform.spaces.keys --markdown > docs/keys.md``), and a config's keys grouped by family in lines
of about 100 columns (the dry run's ``fixed:`` block). The docs themselves are TrialConfig's field
metadata (trainables/config/trial_config.py) and the scheduler and search plans' defaults
(platform/spaces/plans.py)."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import fnmatch
import re
import textwrap
import typing
from typing import Any

from platform.errors import UsageError
from platform.spaces.plans import SchedulerPlan, SearchPlan
from trainables.config import TrialConfig, field_doc, field_names
from trainables.config.checks import describe_type

__all__ = [
    "FAULTS",
    "defaults",
    "family",
    "format_grouped",
    "format_keys",
    "format_markdown",
    "matching_keys",
]

WIDTH = 100
FAULTS = "faults"
# Families follow TrialConfig's declaration order: each starts at the key named here and holds
# the keys declared after it, up to the next start. A key added to config.py joins the family of
# the keys around it; a family may resume further down (optimisation).
_STARTS = {
    "strategy": "distributed",
    "tf32": "optimisation",
    "train_workers": "distributed",
    "micro_batch": "data",
    "model_size": "model",
    "lr": "optimisation",
    "epochs": "training",
    "max_steps": "timing/telemetry",
    "inject_sleep_s": FAULTS,
    "pg_timeout_s": "timeouts",
}


def _families() -> dict[str, str]:
    out, current = {}, None
    for name in field_names():
        current = _STARTS.get(name, current)
        out[name] = current
    return out


_FAMILY = _families()


def family(key: str) -> str:
    """The family a config key is shown under (distributed, data, model, ...)."""
    return _FAMILY[key]


def defaults() -> dict[str, Any]:
    """Every config key's default value."""
    return {f.name: f.default for f in dataclasses.fields(TrialConfig)}


def format_grouped(values: dict[str, Any], indent: int = 2) -> str:
    """``key=value`` pairs in one block per family, wrapped to about 100 columns; fault
    injection keys only when they are set to something other than their default."""
    default = defaults()
    groups: dict[str, list[str]] = {}
    for key, value in values.items():
        name = _FAMILY.get(key, "other")
        if name == FAULTS and value == default[key]:
            continue
        groups.setdefault(name, []).append(f"{key}={_show(value)}")
    label = max((len(g) for g in groups), default=0) + 2
    lines = []
    for name, pairs in groups.items():
        lines.append(
            textwrap.fill(
                " ".join(pairs),
                width=WIDTH,
                initial_indent=" " * indent + f"{name:<{label}}",
                subsequent_indent=" " * (indent + label),
                break_long_words=False,
                break_on_hyphens=False,
            )
        )
    return "\n".join(lines)


def matching_keys(pattern: str) -> list[str]:
    """Keys whose name or family holds ``pattern`` (a glob when it has ``*?[``); UsageError with
    the closest key when none does."""
    names = field_names()
    if not pattern:
        return names
    glob = any(c in pattern for c in "*?[")
    want = pattern.lower()

    def hit(text: str) -> bool:
        return fnmatch.fnmatchcase(text, want) if glob else want in text

    found = [k for k in names if hit(k) or hit(_FAMILY[k])]
    if not found:
        close = difflib.get_close_matches(want.strip("*?[]"), names, n=1)
        hint = f"did you mean {close[0]!r}?" if close else "--keys alone lists every key"
        raise UsageError(f"--keys {pattern!r}: no config key matches; {hint}")
    return found


def format_keys(keys: list[str]) -> str:
    """Each key with its type, default and doc, under its family's heading: one heading per
    family (a family may resume further down the declarations), families in the order each
    first appears."""
    hints = typing.get_type_hints(TrialConfig)
    default = defaults()
    families: dict[str, list[str]] = {}
    for key in keys:
        families.setdefault(_FAMILY[key], []).append(key)
    lines: list[str] = []
    for name, members in families.items():
        lines += [""] if lines else []
        lines.append(f"{name}:")
        for key in members:
            lines.append(f"  {key}  {describe_type(hints[key])}; default {_show(default[key])}")
            lines.append(
                textwrap.fill(
                    field_doc(key),
                    width=WIDTH,
                    initial_indent=" " * 6,
                    subsequent_indent=" " * 6,
                    break_on_hyphens=False,
                )
            )
    return "\n".join(lines)


KEYS_PAGE = "docs/keys.md"
REGENERATE = f"python -m platform.spaces.keys --markdown > {KEYS_PAGE}"


def format_markdown() -> str:
    """docs/keys.md: every config key with its type, default and doc in one table per family
    (as ``--keys`` groups them), then the ``scheduler:`` and ``search:`` settings with their
    defaults. Generated, so the page cannot drift from the code (tests/test_docs.py)."""
    hints = typing.get_type_hints(TrialConfig)
    default = defaults()
    families: dict[str, list[str]] = {}
    for key in field_names():
        families.setdefault(_FAMILY[key], []).append(key)
    lines = [
        "# Configuration keys",
        "",
        f"<!-- Generated from the code by `{REGENERATE}`: do not edit by hand. -->",
        "",
        "Every key of a search space (`grid`, `fixed`, `resources`, `cases`) and of `--set` is a "
        "field of `trainables.config.TrialConfig` (its field docs are this page). `python -m "
        "platform.tune --keys [PATTERN]` prints the same on the console. Unknown keys, wrong "
        "types, out-of-range values and impossible combinations fail before anything starts, "
        "with one line naming the key and the fix. The space file's own keys (`repeats`, "
        "`cases`, `data`, `baseline`, ...) are in [search spaces](search-spaces.md).",
        "",
        "Families: " + ", ".join(f"[{name}](#{_slug(name)})" for name in families) + ", and the "
        "[scheduler and search settings](#scheduler-and-search-settings).",
    ]
    for name, members in families.items():
        lines += [
            "",
            f"## {name}",
            "",
            "| key | type | default | meaning |",
            "| --- | --- | --- | --- |",
        ]
        for key in members:
            kind = describe_type(hints[key]).replace("'", "`")
            lines.append(f"| `{key}` | {kind} | `{_show(default[key])}` | {_md(field_doc(key))} |")
    lines += [
        "",
        "## Scheduler and search settings",
        "",
        "A space's `scheduler:` and `search:` sections (or `--set scheduler=race`, `--set "
        "scheduler.noise_floor=0.05`, `--set 'search={name: random, num_samples: 8}'`), with "
        "their defaults; [faster answers](faster-answers.md) says what each does.",
        "",
        "| setting | default |",
        "| --- | --- |",
    ]
    for section, plan in (("scheduler", SchedulerPlan()), ("search", SearchPlan())):
        for f in dataclasses.fields(plan):
            lines.append(f"| `{section}.{f.name}` | `{getattr(plan, f.name)}` |")
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    """A field doc as Markdown prose: outside its code spans, `<run>` kept as text (not an HTML
    tag) and `*` as a star (not emphasis)."""
    parts = re.split(r"(`[^`]*`)", text)
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")
    return "".join(parts)


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, spaces to hyphens, other punctuation
    dropped."""
    kept = "".join(c for c in heading.lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m platform.spaces.keys",
        description=f"Print the config keys page (regenerate it: {REGENERATE}).",
    )
    parser.add_argument(
        "--markdown", action="store_true", help="the page as Markdown (the default)"
    )
    parser.parse_args(argv)
    print(format_markdown(), end="")
    return 0


def _show(value: Any) -> str:
    """A value as --set takes it; an empty string as ''."""
    return "''" if value == "" else str(value)


if __name__ == "__main__":
    raise SystemExit(main())
