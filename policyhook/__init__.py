"""policyhook: gate every context-compaction call with policies over the provenance of its input.

A summary of a summary re-judges detail with the evidence gone. policyhook decides, before each
summarize call, whether the region about to be summarized can still be re-derived from live
sources, and refuses loudly (`UnsafeRecompactionError`) when it cannot.
"""

from policyhook._postgres import PostgresStore
from policyhook._redis import RedisStore
from policyhook.decisionlog import DecisionLog
from policyhook.errors import (
    PolicyError,
    PolicyIssue,
    StoreUnavailableError,
    UnsafeRecompactionError,
)
from policyhook.hook import Guard, Request, request
from policyhook.loader import load, load_default
from policyhook.policy import Decision, PolicySet
from policyhook.provenance import Ledger, Region, Source
from policyhook.stores import MemoryStore, SQLiteStore, Store

__all__ = [
    "Decision",
    "DecisionLog",
    "Guard",
    "Ledger",
    "MemoryStore",
    "PolicyError",
    "PolicyIssue",
    "PolicySet",
    "PostgresStore",
    "RedisStore",
    "Region",
    "Request",
    "SQLiteStore",
    "Source",
    "Store",
    "StoreUnavailableError",
    "UnsafeRecompactionError",
    "load",
    "load_default",
    "request",
]
