"""The wheels of a GPU machine's payload (scripts/gpu_payload.sh, scripts/gpu_learn.sh; ../shared/GPU.md).

    python scripts/_wheels.py closure 'ray[default,serve]'   the requirement and everything it needs, pinned at the
                                                             versions this environment holds, one per line
    python scripts/_wheels.py missing DIR                    DIR's wheels whose distribution this interpreter lacks,
                                                             one path per line (what to install there)

The closure evaluates each requirement's markers for the GPU machine (CPython 3.12 on Linux x86_64). A wheel is left
out of ``missing`` when its distribution is installed at any version: a second copy first on PYTHONPATH would shadow
the one the machine's torch and transformers were installed with.

Bad input (a requirement that does not parse, a DIR that is not a directory, a file there named ``*.whl`` that is not
a wheel's name, a distribution not installed here) is one ``error:`` line on stderr and exit code 2; nothing is
printed on stdout then.
"""

from __future__ import annotations

import importlib.metadata as md
import sys
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

USAGE = "usage: python scripts/_wheels.py closure REQUIREMENT | python scripts/_wheels.py missing DIR"
TARGET = default_environment() | {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
                                  "platform_system": "Linux", "platform_machine": "x86_64",
                                  "implementation_name": "cpython", "platform_python_implementation": "CPython"}


def closure(requirement: str) -> list[str]:
    """``name==version`` of the distribution ``requirement`` names and of every one it needs (its extras' too), as
    installed here, sorted; a requirement of the target that is not installed here is a ``LookupError``, one that
    does not parse a ``ValueError``."""
    pins: dict[str, str] = {}
    try:
        todo = [Requirement(requirement)]
    except InvalidRequirement as exc:
        raise ValueError(f"{requirement!r} is not a requirement ({str(exc).splitlines()[0]}); pass one such as 'ray[default,serve]'") from None
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
            raise LookupError(f"{req.name} (needed for {requirement}) is not installed here; install it here "
                              "first: the pins are the versions this environment holds") from None
        pins[key[0]] = dist.version
        for line in dist.requires or []:
            sub = Requirement(line)
            extras = [""] + sorted(req.extras)
            if sub.marker is None or any(sub.marker.evaluate(TARGET | {"extra": e}) for e in extras):
                todo.append(sub)
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


def missing(wheels: list[Path]) -> list[Path]:
    """The ``wheels`` whose distribution is not installed in this interpreter; ``ValueError`` for a file name that
    is not a wheel's."""
    out = []
    for wheel in wheels:
        try:
            name = parse_wheel_filename(wheel.name)[0]
        except InvalidWheelFilename as exc:
            raise ValueError(f"{wheel} is not a wheel ({exc}); remove it from {wheel.parent} or rename it "
                             "NAME-VERSION-PYTHON-ABI-PLATFORM.whl") from None
        try:
            md.distribution(name)
        except md.PackageNotFoundError:
            out.append(wheel)
    return out


def wheels_in(folder: str) -> list[Path]:
    """The ``*.whl`` files in the directory ``folder``, sorted; ``ValueError`` when it is not a directory."""
    path = Path(folder)
    if not path.is_dir():
        why = "is not a directory" if path.exists() else "does not exist"
        raise ValueError(f"missing {folder!r}: the wheel directory {why}; pass the directory that holds the wheels")
    return sorted(p for p in path.glob("*.whl") if not p.is_dir())


def main(argv: list[str]) -> int:
    """Print the answer, one item per line; bad input is one ``error:`` line on stderr and exit code 2."""
    if len(argv) != 2 or argv[0] not in ("closure", "missing"):
        print(f"error: {USAGE} (got {' '.join(map(repr, argv)) or 'no arguments'})", file=sys.stderr)
        return 2
    try:
        lines = closure(argv[1]) if argv[0] == "closure" else [str(p) for p in missing(wheels_in(argv[1]))]
    except (LookupError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if lines:
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
