"""Write a space of some cases of another (a shorter run of the same levers on a lent machine):

    python -m benchmarks.fastest_subset h200_fastest 0,2,3,5 NAME

writes search_spaces/NAME.yaml with cases 0, 2, 3 and 5 of h200_fastest (0: the baseline).
"""

from __future__ import annotations

import sys

import yaml

from platform.spaces.load import SPACES_DIR


def main(argv: list[str] | None = None) -> int:
    source, picks, name = (argv if argv is not None else sys.argv[1:])[:3]
    data = yaml.safe_load((SPACES_DIR / f"{source}.yaml").read_text())
    data["cases"] = [data["cases"][int(i)] for i in picks.split(",")]
    base = data.get("baseline") or {}
    if not any(all(c.get(k) == v for k, v in base.items()) for c in data["cases"]):
        data.pop("baseline", None)  # the baseline case is not among them
    data["description"] = f"cases {picks} of {source}: " + str(data.get("description", ""))
    (SPACES_DIR / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
