"""``python -m ziprl.config --show``: the effective config as commented YAML (:func:`describe`)."""

from __future__ import annotations

import dataclasses
import textwrap
from typing import Any

from ziprl.boundary import run_command
from ziprl.config.loader import load_config
from ziprl.config.schema import ZipRLConfig


def _yaml_scalar(value: Any) -> str:
    """``value`` as one line of YAML flow syntax (quoted where YAML needs it)."""
    import yaml

    return yaml.safe_dump([value], default_flow_style=True, width=2**31, allow_unicode=True).strip()[1:-1]


def _comment(text: str, indent: str) -> list[str]:
    return [f"{indent}# {line}" for line in textwrap.wrap(text, 110 - len(indent) - 2)]


def describe(cfg: ZipRLConfig | None = None) -> str:
    """The effective config as YAML: each section under its docstring, each field under its help and default
    (``# ...`` comments), so the text loads back to an equal config."""
    cfg = cfg or ZipRLConfig()

    def section(obj: Any, depth: int) -> list[str]:
        out, indent = [], "  " * depth
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                out += ["", *_comment(" ".join(type(value).__doc__.split()), indent), f"{indent}{f.name}:"]
                out += section(value, depth + 1)
                continue
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            out += _comment(f"{f.metadata['help']} Default: {_yaml_scalar(default)}.", indent)
            out.append(f"{indent}{f.name}: {_yaml_scalar(value)}")
        return out

    return "\n".join(section(cfg, 0)).lstrip("\n") + "\n"


@run_command
def main(argv: list[str]) -> int:
    """``python -m ziprl.config --show [--config FILE.yaml] [--set section.field=value ...]``."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m ziprl.config", description="Print the effective configuration.")
    ap.add_argument("--show", action="store_true", required=True, help="print every field, its value and its help")
    ap.add_argument("--config")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    args = ap.parse_args(argv)
    print(describe(load_config(args.config, args.set)), end="")
