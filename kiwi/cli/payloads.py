"""`kiwi payloads prune`: remove the payload store's files no run still refers to (kiwi/payloads.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

EXIT_OK = 0
DEFAULT_DAYS = 7.0


def cmd_payloads(args: argparse.Namespace) -> int:
    from kiwi.connect import connect
    from kiwi.payloads import check_prune_age, prune

    check_prune_age(args.older_than * 86400)  # (before connecting: the mistake is the command's)

    async def go() -> dict:
        client = await connect(args.address, args.namespace)
        return await prune(
            client,
            args.older_than * 86400,
            dry_run=args.dry_run,
            progress=lambda n: print(f"kiwi payloads: read {n} runs' histories...", file=sys.stderr),
        )

    done = asyncio.run(go())
    if args.json:
        print(json.dumps(done, indent=2))
        return EXIT_OK
    verb = "would remove" if done["dry_run"] else "removed"
    print(
        f"{verb} {len(done['removed'])} payloads ({done['bytes_freed'] / 1e6:.1f} MB) from {done['store']}; "
        f"kept {done['kept_in_use']} older than {args.older_than:g} days that runs still refer to "
        f"({done['runs_read']} runs read)"
    )
    return EXIT_OK


def add_commands(sub: argparse._SubParsersAction) -> None:
    from kiwi.cli.connection import _temporal

    p = sub.add_parser(
        "payloads",
        help="the payload store: payloads of 256 KB and more that runs refer to (README: Large payloads)",
    )
    psub = p.add_subparsers(dest="payloads_command", metavar="ACTION", required=True)
    q = psub.add_parser(
        "prune",
        help="remove stored payloads no run refers to any more",
        description="Read the history of every run every namespace of the Temporal server still holds "
        "(open, and closed within its retention; --namespace alone if the server will not list them) and "
        "remove the store's files that none of them refers to and that nobody stored in the last "
        "--older-than days (nor since --older-than days before a workflow task no worker has taken yet). "
        "Run it where the store is (KIWI_PAYLOAD_STORE, else $KIWI_HOME/payloads), against the server the "
        "runs are on.",
    )
    _temporal(q)
    q.add_argument(
        "--older-than",
        type=float,
        default=DEFAULT_DAYS,
        metavar="DAYS",
        help=f"only payloads last stored more than this many days ago (default {DEFAULT_DAYS:g}; at least "
        "1 hour, 0.042 days: a newer one may belong to a call on its way)",
    )
    q.add_argument("--dry-run", action="store_true", help="say what would be removed; remove nothing")
    q.add_argument("--json", action="store_true", help="print JSON")
    q.set_defaults(func=cmd_payloads)
