"""Exit codes of the `policyhook` commands: one definition, documented in docs/cli.md."""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    """What the exit code of a command says (check, eval, test, replay, init, demo)."""

    OK = 0  #: done, and nothing wrong was found
    PROBLEM = 1  #: the command found a problem: policy errors, failed cases, changed decisions
    USAGE = 2  #: bad usage or unreadable input: options, a missing path, a file that cannot be read
    #: The reader of the output went away (`policyhook test -v | head`): nothing more is written,
    #: no traceback; the code a process killed by SIGPIPE has in a shell.
    BROKEN_PIPE = 141


class HookExit(IntEnum):
    """Exit codes of the Claude Code hooks, which Claude Code reads by its hook protocol.

    2 is never used: Claude Code reads it as "block" only when bash runs the hook (not under
    PowerShell), and a PostCompact hook has nothing left to block.
    """

    #: The answer, if any, is on stdout. claude-precompact always exits so: every other code is
    #: a "non-blocking error" after which Claude Code compacts ungated, so it answers a failure
    #: with a fail-closed block instead.
    ANSWERED = 0
    #: A non-blocking error: Claude Code shows stderr and goes on. Only claude-postcompact, which
    #: runs after the compaction, uses it.
    ERROR = 1
