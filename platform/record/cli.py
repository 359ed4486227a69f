"""What every command-line tool says about itself: ``--version`` (the installed package's
version and, from a git checkout, its commit: stage1_common/version.py) and ``--help`` with
each option's default."""

from __future__ import annotations

import argparse
import copy

from stage1_common.version import version_line

__all__ = ["cli_parser"]


def cli_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """An ArgumentParser whose --help shows defaults, with ``--version``."""
    p = argparse.ArgumentParser(prog=prog, description=description, formatter_class=_Help)
    p.add_argument(
        "--version", action=_Version, help="print the package version and git commit, and exit"
    )
    return p


class _Version(argparse.Action):
    """Like argparse's version action, but the line (a git call) is made only when asked."""

    def __init__(self, option_strings, dest, help=None):  # noqa: A002 - argparse's name
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit()


class _Help(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help when it has a default worth showing and its
    help does not already say it (an option without help gets just that)."""

    def _format_action(self, action: argparse.Action) -> str:
        if action.help is None and _shows_default(action):
            action = copy.copy(action)
            action.help = "(default: %(default)s)"
        return super()._format_action(action)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if _shows_default(action) and "default" not in text:
            text += " (default: %(default)s)"
        return text


def _shows_default(action: argparse.Action) -> bool:
    default = action.default
    unset = default is None or default is False or default == [] or default == argparse.SUPPRESS
    return bool(action.option_strings) and not unset
