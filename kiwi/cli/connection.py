"""The options every subcommand that talks to Temporal shares (--project, --all-projects,
--address, --namespace, --task-queue), and the checks of their values."""

from __future__ import annotations

import argparse

from kiwi.cli import project_option


def _port(text: str) -> int:
    """A TCP port given on the command line: 1 to 65535."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is no port number: give one from 1 to 65535")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


def _project(parser: argparse.ArgumentParser, scope: bool = True) -> None:
    project_option(parser)
    if scope:
        parser.add_argument(
            "--all-projects",
            action="store_true",
            help="list and act on runs of every project, not only this one's",
        )


def _connection(parser: argparse.ArgumentParser, scope: bool = True, project: bool = True) -> None:
    """--project (and, with ``scope``, --all-projects), --address, --namespace and --task-queue."""
    if project:
        _project(parser, scope)
    _temporal(parser)
    parser.add_argument("--task-queue", default="kiwi", help="task queue of the Kiwi workers (default: kiwi)")


def _temporal(parser: argparse.ArgumentParser) -> None:
    """--address and --namespace: which Temporal, and which namespace of it."""
    parser.add_argument(
        "--address",
        help="Temporal address (default: KIWI_TEMPORAL_ADDRESS, else Temporal's environment configuration: "
        "TEMPORAL_ADDRESS or the temporal.toml profile TEMPORAL_PROFILE in TEMPORAL_CONFIG_FILE, with its "
        "TLS and API key; else the address the project's temporal-dev.yml gives `kiwi dev`, when it is this "
        "machine's; else that of the `kiwi dev` running on your own database, found by its lock, whatever "
        "--port it was given; else 127.0.0.1:7233)",
    )
    parser.add_argument(
        "--namespace",
        help="Temporal namespace (default: KIWI_TEMPORAL_NAMESPACE, else the profile's or TEMPORAL_NAMESPACE, "
        "else default)",
    )
