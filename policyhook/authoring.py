"""Policy authoring commands: check, eval, test, replay (modelled on opa / kyverno)."""

from __future__ import annotations

import argparse
from typing import Any


def add_commands(commands: Any) -> None:
    """Register the authoring subcommands on the `policyhook` parser."""
    _ = (commands, argparse)
