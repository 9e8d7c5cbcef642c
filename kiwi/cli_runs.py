"""``kiwi`` subcommands that talk to Temporal: dev, worker, run, runs, status, complete-step, cancel, audit."""

from __future__ import annotations

import argparse


def add_commands(sub: argparse._SubParsersAction) -> None:
    return None
