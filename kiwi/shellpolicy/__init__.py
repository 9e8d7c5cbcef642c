"""What a shell grant allows: the program, its options and the paths its arguments name.

A grant ``<execute resource="shell" commands="git,ls"/>`` allows running those programs as
themselves, never as a way to run another program or to reach outside the run's filesystem
grants. ``check_argv`` decides one argv:

- programs that run other programs or code (shells, launchers, interpreters, editors, builders,
  remote shells) are refused even when granted, ``commands="*"`` included;
- options that make a known program run something (``git -c``, ``find -exec``, ``rg --pre``,
  ``tar --to-command``...) are refused; a few that delete or write files (``find -delete``) need
  the grant's ``options`` attribute;
- every path an argument names is resolved against ``cwd`` and checked against the run's read
  grants, or write grants for what a program writes; absolute paths, ``~`` and ``..`` out of the
  project are refused; protected places need a grant that names them;
- harness ``blocked_commands`` match the parsed argv (``rm -fr x`` is ``rm -rf``).

Pure (no I/O, deterministic), so workflow code can import it. The worker re-checks the paths
with symlinks resolved (``path_arguments`` says which arguments are paths).

The parts: ``results`` (verdicts), ``rules`` (the rules' patch ids), ``specs`` (each program's options
and operands), ``options`` (reading options as the program does), ``paths`` (operands resolved and
checked), ``programs`` (programs that run others, names programs make), ``archives``, ``find``, ``git``,
``folders`` (whole-folder reads and changes) and ``check`` (``check_argv``, ``blocked_by``).
"""

from __future__ import annotations

from kiwi.shellpolicy.archives import Unpacking, unpacking
from kiwi.shellpolicy.check import blocked_by, check_argv, path_arguments
from kiwi.shellpolicy.find import FIND_GRANTABLE
from kiwi.shellpolicy.folders import (
    LinkMoves,
    denied_inside,
    folder_uses,
    inside_refusal,
    link_moves,
    names_from_a_list,
    ungranted_below,
)
from kiwi.shellpolicy.git import GIT_REFUSED_OPTIONS, GIT_SUBCOMMANDS
from kiwi.shellpolicy.options import down_and_up
from kiwi.shellpolicy.paths import protected_inside, tree_granted
from kiwi.shellpolicy.programs import (
    LATER_REFUSED,
    REFUSED_PROGRAMS,
    later_refused,
    modeled_program,
    program_name,
    refused_program,
    unchecked_names,
    worker_refusal,
)
from kiwi.shellpolicy.results import PathArgument, ShellVerdict
from kiwi.shellpolicy.specs import SPECS

__all__ = [
    "FIND_GRANTABLE",
    "GIT_REFUSED_OPTIONS",
    "GIT_SUBCOMMANDS",
    "LATER_REFUSED",
    "LinkMoves",
    "PathArgument",
    "REFUSED_PROGRAMS",
    "SPECS",
    "ShellVerdict",
    "Unpacking",
    "blocked_by",
    "check_argv",
    "denied_inside",
    "down_and_up",
    "folder_uses",
    "inside_refusal",
    "later_refused",
    "link_moves",
    "modeled_program",
    "names_from_a_list",
    "path_arguments",
    "program_name",
    "protected_inside",
    "refused_program",
    "tree_granted",
    "unchecked_names",
    "ungranted_below",
    "unpacking",
    "worker_refusal",
]
