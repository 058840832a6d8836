"""The wheels of a GPU machine's payload (scripts/gpu_payload.sh, scripts/gpu_learn.sh; ../shared/GPU.md).

    python scripts/_wheels.py closure 'ray[default,serve]'   the requirement and everything it needs, pinned at the
                                                             versions this environment holds, one per line
    python scripts/_wheels.py missing DIR                    DIR's wheels whose distribution this interpreter lacks,
                                                             one path per line (what to install there)

The closure evaluates each requirement's markers for the GPU machine (CPython 3.12 on Linux x86_64). A wheel is left
out of ``missing`` when its distribution is installed at any version: a second copy first on PYTHONPATH would shadow
the one the machine's torch and transformers were installed with.
"""

from __future__ import annotations

import importlib.metadata as md
import sys
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

TARGET = default_environment() | {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
                                  "platform_system": "Linux", "platform_machine": "x86_64",
                                  "implementation_name": "cpython", "platform_python_implementation": "CPython"}


def closure(requirement: str) -> list[str]:
    """``name==version`` of the distribution ``requirement`` names and of every one it needs (its extras' too), as
    installed here, sorted; a requirement of the target that is not installed here is a ``LookupError``."""
    pins: dict[str, str] = {}
    todo = [Requirement(requirement)]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            raise LookupError(f"{req.name} (needed for {requirement}) is not installed here") from None
        pins[key[0]] = dist.version
        for line in dist.requires or []:
            sub = Requirement(line)
            extras = [""] + sorted(req.extras)
            if sub.marker is None or any(sub.marker.evaluate(TARGET | {"extra": e}) for e in extras):
                todo.append(sub)
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


def missing(wheels: list[Path]) -> list[Path]:
    """The ``wheels`` whose distribution is not installed in this interpreter."""
    out = []
    for wheel in wheels:
        name = parse_wheel_filename(wheel.name)[0]
        try:
            md.distribution(name)
        except md.PackageNotFoundError:
            out.append(wheel)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("closure", "missing"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        lines = (closure(argv[1]) if argv[0] == "closure"
                 else [str(p) for p in missing(sorted(Path(argv[1]).glob("*.whl")))])
    except LookupError as exc:
        print(f"_wheels: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
