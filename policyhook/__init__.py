"""policyhook: gate every context-compaction call with policies over the provenance of its input.

A summary of a summary re-judges detail with the evidence gone. policyhook decides, before each
summarize call, whether the region about to be summarized can still be re-derived from live
sources, and refuses loudly (`UnsafeRecompactionError`) when it cannot.
"""

from importlib.metadata import PackageNotFoundError, version

from policyhook._errors import (
    PolicyError,
    PolicyIssue,
    StoreUnavailableError,
    UnsafeRecompactionError,
)
from policyhook._hook import Guard, GuardedCall, Request, current_request, request
from policyhook._loader import load, load_default
from policyhook._policy import Decision, Effect, FailurePolicy, Mode, PolicySet
from policyhook._postgres import PostgresStore
from policyhook._provenance import Ledger, Region, Source, SourceIdConflictError
from policyhook._redis import RedisStore
from policyhook.decisionlog import DecisionLog
from policyhook.stores import MemoryStore, SQLiteStore, Store

try:
    __version__ = version("policyhook")
except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "Decision",
    "DecisionLog",
    "Effect",
    "FailurePolicy",
    "Guard",
    "GuardedCall",
    "Ledger",
    "MemoryStore",
    "Mode",
    "PolicyError",
    "PolicyIssue",
    "PolicySet",
    "PostgresStore",
    "RedisStore",
    "Region",
    "Request",
    "SQLiteStore",
    "Source",
    "SourceIdConflictError",
    "Store",
    "StoreUnavailableError",
    "UnsafeRecompactionError",
    "__version__",
    "current_request",
    "load",
    "load_default",
    "request",
]
