"""RedisStore: the fleet's lighter shared store, a handful of hashes in one Redis (or cluster).

Every key is `{namespace}:...`: the braces are a hash tag, so every key of a store lives in one
cluster slot and each call is one command or one Lua script, in one round trip, on a single
server or a cluster alike. Liveness of any number of sources is one script over one hash
(`HMGET`), judged against the server's clock (`TIME`), so workers with skewed clocks agree on
what has expired. Texts are stored as UTF-8 bytes (lone surrogates passed through); entries as
JSON (ASCII, so lone surrogates survive), read only by Python; lists the scripts must read
(a summary's parents and direct sources) as netstrings.

Faults: each socket operation is bounded by `timeout` (connect and read), a connection found
dead (the server restarted) is replaced and the command retried once; what still fails raises
`StoreUnavailableError`, which the guard turns into "every source dead" for that decision.
redis-py is imported when a store is made, so `policyhook` imports without the `redis` extra.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Collection, Sequence
from typing import Any

from policyhook._errors import StoreUnavailableError
from policyhook._provenance import (
    Entry,
    FactRecord,
    Region,
    Source,
    SourceIdConflictError,
    State,
    View,
    check_seconds,
)

#: The layout version this code writes, kept in `{ns}:meta`. 1: the store; 2: per-fact
#: provenance (`facts:S` keys); 3: a source id names one text (`put_source` compares the digest
#: `srcinfo` has kept since 1, so code that would replace an id's text refuses the layout).
#: Nothing to convert in either, so migrating is raising the version.
SCHEMA_VERSION = 3
_NAMESPACE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")

# Keys (after the `{ns}:` prefix):
#   meta      hash   secret, version
#   seq       int    the last sequence number given to a write
#   live      hash   source id -> expiry (ms since the epoch, server clock; 0: none). Held iff here
#   dead      hash   source id -> "evicted" | "expired": the tombstones
#   src       hash   source id -> text (while held)
#   srcinfo   hash   source id -> digest of its current text (32 hex chars), then its kind
#   recent    zset   held source id -> seq of its last put
#   expiry    zset   held source id with a TTL -> expiry (for purging)
#   entries   hash   digest -> JSON entry
#   owner     hash   digest of a source text -> source id
#   log       zset   digest -> seq (the order `since` pages through)
#   links     hash   summary id -> netstrings: number of parents, parents, direct sources
#   stext     hash   digest -> summary text
#   windows   hash   window -> deepest summary depth
#   anchors   hash   anchor -> digests of the texts starting with it (32 hex chars each)
#   win:W     zset   digest of a summary of window W -> seq
#   facts:S   hash   netstring of a fact of summary S, then a source id stating it -> "1"

_LIB = """
-- Add `digest` (32 hex chars) to the digests listed under `anchor` in hash `key`.
local function index_anchor(key, anchor, digest)
  local listed = redis.call('HGET', key, anchor) or ''
  for i = 1, #listed, 32 do
    if string.sub(listed, i, i + 31) == digest then return end
  end
  redis.call('HSET', key, anchor, listed .. digest)
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- Is source `id` held at `now`? An expired one is turned into a tombstone on the way.
local function held(live, dead, src, recent, expiry, id, now)
  local exp = redis.call('HGET', live, id)
  if not exp then return false end
  if exp ~= '0' and tonumber(exp) <= now then
    redis.call('HDEL', live, id)
    redis.call('HDEL', src, id)
    redis.call('ZREM', recent, id)
    redis.call('ZREM', expiry, id)
    redis.call('HSET', dead, id, 'expired')
    return false
  end
  return true
end
"""

# KEYS: live dead src recent expiry | ARGV: ids
_LIVE = (
    _LIB
    + """
local now = now_ms()
local out = {}
for _, id in ipairs(ARGV) do
  if held(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], id, now) then out[#out + 1] = id end
end
return out
"""
)

# KEYS: live dead src recent expiry | ARGV: ids -> flat [id, state, ...] for known ids
_STATES = (
    _LIB
    + """
local now = now_ms()
local out = {}
for _, id in ipairs(ARGV) do
  if held(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], id, now) then
    out[#out + 1] = id; out[#out + 1] = 'live'
  else
    local state = redis.call('HGET', KEYS[2], id)
    if state then out[#out + 1] = id; out[#out + 1] = state end
  end
end
return out
"""
)

# KEYS: live dead src recent expiry | ARGV: id
_GET = (
    _LIB
    + """
if held(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[1], now_ms()) then
  return redis.call('HGET', KEYS[3], ARGV[1])
end
return false
"""
)

# KEYS: live dead src recent expiry | ARGV: ids -> flat [id, text, ...] for the held ones
_GET_MANY = (
    _LIB
    + """
local now = now_ms()
local out = {}
for _, id in ipairs(ARGV) do
  if held(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], id, now) then
    out[#out + 1] = id
    out[#out + 1] = redis.call('HGET', KEYS[3], id)
  end
end
return out
"""
)

# KEYS: live dead src recent expiry | ARGV: id
_EVICT = (
    _LIB
    + """
local id = ARGV[1]
if not held(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], id, now_ms()) then return 0 end
redis.call('HDEL', KEYS[1], id)
redis.call('HDEL', KEYS[3], id)
redis.call('ZREM', KEYS[4], id)
redis.call('ZREM', KEYS[5], id)
redis.call('HSET', KEYS[2], id, 'evicted')
return 1
"""
)

# KEYS: live dead src recent expiry seq srcinfo entries owner log anchors
# ARGV: id text ttl_ms info digest entry anchor -> the new seq; or, when `id` names another
# text (`srcinfo` keeps its digest on the tombstone too), the id's state, and nothing changed.
_PUT_SOURCE = (
    _LIB
    + """
local id, ttl = ARGV[1], tonumber(ARGV[3])
local now = now_ms()
local named = redis.call('HGET', KEYS[7], id)
if named and string.sub(named, 1, 32) ~= ARGV[5] then
  local exp = redis.call('HGET', KEYS[1], id)
  if exp and (exp == '0' or tonumber(exp) > now) then return 'live' end
  if exp then return 'expired' end
  return redis.call('HGET', KEYS[2], id) or 'evicted'
end
-- Purge a few expired sources (their texts), so a TTL bounds memory without a sweeper.
local due = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now, 'LIMIT', 0, 16)
for _, old in ipairs(due) do
  if old ~= id then held(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], old, now) end
end
local seq = redis.call('INCR', KEYS[6])
if ttl > 0 then
  redis.call('HSET', KEYS[1], id, now + ttl)
  redis.call('ZADD', KEYS[5], now + ttl, id)
else
  redis.call('HSET', KEYS[1], id, '0')
  redis.call('ZREM', KEYS[5], id)
end
redis.call('HDEL', KEYS[2], id)
redis.call('HSET', KEYS[3], id, ARGV[2])
redis.call('ZADD', KEYS[4], seq, id)
redis.call('HSET', KEYS[7], id, ARGV[4])
redis.call('HSET', KEYS[9], ARGV[5], id)
-- A summary's text put as a source keeps the summary's entry (never plain evidence).
local known = redis.call('HGET', KEYS[8], ARGV[5])
if not known or cjson.decode(known)[3] == 0 then
  redis.call('HSET', KEYS[8], ARGV[5], ARGV[6])
  redis.call('ZADD', KEYS[10], seq, ARGV[5])
  if ARGV[7] ~= '' then index_anchor(KEYS[11], ARGV[7], ARGV[5]) end
end
return seq
"""
)

# KEYS: seq entries log links stext windows win anchors facts
# ARGV: digest entry id links text window depth anchor expected, then (fact, source) fields
# Compare-and-set: writes only if the digest's current entry is `expected` ('' for none), else
# returns the current one (the caller merges and tries again), so a merge is never lost.
_PUT_SUMMARY = (
    _LIB
    + """
local current = redis.call('HGET', KEYS[2], ARGV[1]) or ''
if current ~= ARGV[9] then return current end
local seq = redis.call('INCR', KEYS[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[3], seq, ARGV[1])
redis.call('HSET', KEYS[4], ARGV[3], ARGV[4])
redis.call('HSET', KEYS[5], ARGV[1], ARGV[5])
local depth = tonumber(redis.call('HGET', KEYS[6], ARGV[6]) or '0')
if tonumber(ARGV[7]) > depth then redis.call('HSET', KEYS[6], ARGV[6], ARGV[7]) end
redis.call('ZADD', KEYS[7], seq, ARGV[1])
if ARGV[8] ~= '' then index_anchor(KEYS[8], ARGV[8], ARGV[1]) end
for i = 10, #ARGV do redis.call('HSET', KEYS[9], ARGV[i], '1') end
return false
"""
)

# KEYS: facts:S for each summary -> for each, its (fact, source) fields
_FACTS = """
local out = {}
for i, key in ipairs(KEYS) do out[i] = redis.call('HKEYS', key) end
return out
"""

# KEYS: meta | ARGV: version -> the version before (raised to ARGV[1] if it was lower)
_MIGRATE = """
local version = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
if version < tonumber(ARGV[1]) then redis.call('HSET', KEYS[1], 'version', ARGV[1]) end
return version
"""

# KEYS: entries anchors | ARGV: anchors -> JSON entries
_BY_ANCHOR = """
-- HMGET in chunks: unpack() of more than a few thousand values overflows Lua's C stack.
local function hmget(key, names)
  local out = {}
  for i = 1, #names, 512 do
    local got = redis.call('HMGET', key, unpack(names, i, math.min(i + 511, #names)))
    for j = 1, #got do out[#out + 1] = got[j] end
  end
  return out
end
local digests = {}
for _, listed in ipairs(hmget(KEYS[2], ARGV)) do
  if listed then
    for i = 1, #listed, 32 do digests[#digests + 1] = string.sub(listed, i, i + 31) end
  end
end
local out = {}
for _, e in ipairs(hmget(KEYS[1], digests)) do
  if e then out[#out + 1] = e end
end
return out
"""

#: `rests_on(links, root, emit)`: calls `emit(id)` once for each source summary `root` rests on,
#: following each parent once through the `links` hash (`n:parents`, then parents, then sources).
_RESTS_ON_LIB = """
local function items(s)
  local out, pos = {}, 1
  while pos <= #s do
    local colon = string.find(s, ':', pos, true)
    local n = tonumber(string.sub(s, pos, colon - 1))
    out[#out + 1] = string.sub(s, colon + 1, colon + n)
    pos = colon + n + 1
  end
  return out
end
local function rests_on(links_key, root, emit)
  local seen, todo, found = {[root] = true}, {root}, {}
  while #todo > 0 do
    local links = redis.call('HGET', links_key, table.remove(todo))
    if links then
      local list = items(links)
      local parents = tonumber(list[1])
      for i = 2, #list do
        local id = list[i]
        if i <= parents + 1 then
          if not seen[id] then seen[id] = true; todo[#todo + 1] = id end
        elseif not found[id] then
          found[id] = true; emit(id)
        end
      end
    end
  end
end
"""

# KEYS: links | ARGV: summary ids -> flat [root, source, ...]
_RESTS_ON = (
    _RESTS_ON_LIB
    + """
local out = {}
for _, root in ipairs(ARGV) do
  rests_on(KEYS[1], root, function(id) out[#out + 1] = root; out[#out + 1] = id end)
end
return out
"""
)

#: The entries written after `cursor` (at most `limit`), each with its text while held, as a flat
#: [seq, entry, text or false, ...]; empty at once when nothing was written since. For the scripts
#: whose KEYS begin: seq log entries stext owner live dead src recent expiry srcinfo.
_SINCE_ROWS = """
local function since_rows(cursor, limit, now)
  local out = {}
  if tonumber(redis.call('GET', KEYS[1]) or '0') <= cursor then return out end
  local rows = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. cursor, '+inf', 'WITHSCORES',
    'LIMIT', 0, limit)
  for i = 1, #rows, 2 do
    local digest = rows[i]
    local text = redis.call('HGET', KEYS[4], digest)
    if not text then
      local id = redis.call('HGET', KEYS[5], digest)
      text = false
      if id and held(KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10], id, now) then
        local info = redis.call('HGET', KEYS[11], id)
        if string.sub(info, 1, 32) == digest then text = redis.call('HGET', KEYS[8], id) end
      end
    end
    out[#out + 1] = rows[i + 1]
    out[#out + 1] = redis.call('HGET', KEYS[3], digest)
    out[#out + 1] = text
  end
  return out
end
"""

# KEYS: seq log entries stext owner live dead src recent expiry srcinfo | ARGV: cursor limit
# -> flat [seq, entry, text or false, ...]; empty at once when nothing was written since.
_SINCE = (
    _LIB
    + _SINCE_ROWS
    + """
return since_rows(tonumber(ARGV[1]), tonumber(ARGV[2]), now_ms())
"""
)

# KEYS: seq log entries stext owner live dead src recent expiry srcinfo links windows
# ARGV: cursor limit window ('' for none) n_digests digests... source_ids...
# -> {since flat [seq, entry, text or false, ...], found entries, closure flat [root, source, ...],
#     held ids, window depth or false}: one script, one round trip.
_VIEW = (
    _LIB
    + _SINCE_ROWS
    + _RESTS_ON_LIB
    + """
local cursor, limit, window, n = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local now = now_ms()
local since = since_rows(cursor, limit, now)
local found, closure, ask, asked = {}, {}, {}, {}
local function want(id)
  if not asked[id] then asked[id] = true; ask[#ask + 1] = id end
end
for i = 5, 4 + n do
  local entry = redis.call('HGET', KEYS[3], ARGV[i])
  if entry then
    found[#found + 1] = entry
    local id = redis.call('HGET', KEYS[5], ARGV[i])
    if id then want(id) end  -- a source's own text
  end
end
for i = 5 + n, #ARGV do want(ARGV[i]) end
-- Summaries found: every source each rests on (each parent followed once), by entry id. The
-- ids come from the entries' JSON: read only the links hash, keyed by id, for the walk.
local roots = {}
for _, entry in ipairs(found) do
  local fields = cjson.decode(entry)
  if fields[3] > 0 then roots[#roots + 1] = fields[2] end
end
for _, root in ipairs(roots) do
  rests_on(KEYS[12], root, function(id)
    closure[#closure + 1] = root; closure[#closure + 1] = id; want(id)
  end)
end
local live = {}
for _, id in ipairs(ask) do
  if held(KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10], id, now) then live[#live + 1] = id end
end
local depth = false
if window ~= '' then depth = redis.call('HGET', KEYS[13], window) or '0' end
return {since, found, closure, live, depth}
"""
)

# KEYS: live dead src recent expiry srcinfo | ARGV: limit -> flat [id, info, text, ...]
_SOURCES = (
    _LIB
    + """
local limit, now, out, start = tonumber(ARGV[1]), now_ms(), {}, 0
while #out < 3 * limit do
  local ids = redis.call('ZREVRANGE', KEYS[4], start, start + limit - 1)
  if #ids == 0 then break end
  for _, id in ipairs(ids) do
    if #out < 3 * limit and held(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], id, now) then
      out[#out + 1] = id
      out[#out + 1] = redis.call('HGET', KEYS[6], id)
      out[#out + 1] = redis.call('HGET', KEYS[3], id)
    end
  end
  start = start + limit
end
return out
"""
)

# KEYS: win entries stext | ARGV: limit -> flat [entry, text, ...], newest first
_SUMMARIES = """
local digests = redis.call('ZREVRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
local out = {}
for _, d in ipairs(digests) do
  out[#out + 1] = redis.call('HGET', KEYS[2], d)
  out[#out + 1] = redis.call('HGET', KEYS[3], d)
end
return out
"""


def _b(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _s(data: bytes) -> str:
    return data.decode("utf-8", "surrogatepass")


def _netstrings(items: Sequence[str]) -> bytes:
    return b"".join(b"%d:%s" % (len(data), data) for data in map(_b, items))


def _dump(entry: Entry) -> str:
    return json.dumps(
        [
            entry.digest,
            entry.id,
            entry.depth,
            entry.kind,
            entry.size,
            entry.anchor,
            entry.parents,
            entry.sources,
            entry.source_kinds,
            entry.window,
        ]
    )


def _load(data: bytes) -> Entry:
    d, i, depth, kind, size, anchor, parents, direct, kinds, window = json.loads(data)
    return Entry(
        digest=d,
        id=i,
        depth=depth,
        kind=kind,
        size=size,
        anchor=anchor,
        parents=tuple(parents),
        sources=tuple(direct),
        source_kinds=tuple(kinds),
        window=window,
    )


class RedisStore:
    """Sources, summaries and tombstones in one Redis (or Redis Cluster), shared by a fleet.

    `url`: `redis://[user:password@]host:port/db` (or `rediss://`, `unix://`), or pass a ready
    `client` (a `redis.Redis` or `redis.cluster.RedisCluster`, made with `decode_responses=False`)
    instead. `namespace`: the hash tag every key starts with (several stores can share a Redis
    under different namespaces). `ttl`: seconds after which a source expires (server clock, from
    its last put; reads never extend it). `timeout`: seconds any socket operation may take.
    Redis must persist (AOF or RDB) for a restart to keep what was recorded.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        client: Any = None,
        namespace: str = "policyhook",
        ttl: float | None = None,
        timeout: float = 5.0,
    ) -> None:
        if (url is None) == (client is None):
            raise ValueError('RedisStore needs exactly one of "url" or "client"')
        if not _NAMESPACE.fullmatch(namespace):
            raise ValueError(f'"namespace" must match [A-Za-z0-9_.:-]{{1,64}}: {namespace!r}')
        if ttl is not None:
            check_seconds("ttl", ttl)
        check_seconds("timeout", timeout)
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError as exc:
            raise ImportError('RedisStore needs redis-py: pip install "policyhook[redis]"') from exc
        self._redis = redis
        errors = redis.exceptions
        #: Server down, unreachable, loading, or a cluster without a master for the slot.
        self._unavailable = (errors.ConnectionError, errors.TimeoutError, errors.ClusterError)
        self.namespace, self.ttl, self.timeout = namespace, ttl, timeout
        if client is None:
            assert url is not None
            try:
                client = redis.Redis.from_url(
                    url,
                    socket_timeout=timeout,
                    socket_connect_timeout=timeout,
                    retry=Retry(NoBackoff(), 1),  # once: a pooled connection the restart killed
                    retry_on_error=[redis.ConnectionError],
                    decode_responses=False,
                )
            except ValueError as exc:
                raise ValueError(f"RedisStore: invalid url: {exc}") from exc
            kwargs = client.connection_pool.connection_kwargs
            where = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"
            self._where = f"Redis at {where}/{kwargs.get('db', 0)} (namespace {namespace})"
        else:
            self._where = f"Redis via {type(client).__name__} (namespace {namespace})"
        self._client = client
        self._owns_client = url is not None
        tag = "{" + namespace + "}:"
        self._prefix = _b(tag)
        names = (
            "meta seq live dead src srcinfo recent expiry entries owner log links stext windows "
            "anchors"
        )
        k = {n: _b(tag + n) for n in names.split(" ")}
        self._k = k
        self._held = [k["live"], k["dead"], k["src"], k["recent"], k["expiry"]]
        script = client.register_script
        self._live, self._states = script(_LIVE), script(_STATES)
        self._get, self._evict = script(_GET), script(_EVICT)
        self._get_many = script(_GET_MANY)
        self._put_source, self._put_summary = script(_PUT_SOURCE), script(_PUT_SUMMARY)
        self._by_anchor, self._rests_on = script(_BY_ANCHOR), script(_RESTS_ON)
        self._since, self._sources = script(_SINCE), script(_SOURCES)
        self._summaries = script(_SUMMARIES)
        self._facts, self._migrate = script(_FACTS), script(_MIGRATE)
        self._view = script(_VIEW)
        self._secret: bytes = self._run("open", self._open)

    def __repr__(self) -> str:
        return f"RedisStore({self._where})"

    def close(self) -> None:
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> RedisStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing -------------------------------------------------------------------------------

    def _run(self, what: str, work: Any, *args: Any) -> Any:
        """`work(*args)`; a connection or timeout failure becomes StoreUnavailableError."""
        try:
            return work(*args)
        except self._unavailable as exc:
            raise StoreUnavailableError(
                f"{self._where}: {what} failed ({self.timeout:g}s timeout): "
                f"{' '.join(str(exc).split()) or type(exc).__name__}"
            ) from exc
        except self._redis.ResponseError as exc:
            if str(exc).startswith(("TRYAGAIN", "BUSY", "READONLY")):  # failover, slow script
                raise StoreUnavailableError(f"{self._where}: {what} failed: {exc}") from exc
            raise

    def _key(self, kind: str, name: str) -> bytes:
        return self._prefix + kind.encode() + b":" + _b(name)

    def _open(self) -> bytes:
        """Set the secret and version once (HSETNX), check the version, read the secret."""
        meta = self._k["meta"]
        with self._client.pipeline(transaction=True) as pipe:
            pipe.hsetnx(meta, "secret", os.urandom(32))
            pipe.hsetnx(meta, "version", SCHEMA_VERSION)
            pipe.hmget(meta, ["secret", "version"])
            secret, version = pipe.execute()[-1]
        if int(version) > SCHEMA_VERSION:
            raise StoreUnavailableError(
                f"{self._where}: layout version {int(version)} was written by a newer policyhook "
                f"(this one knows up to {SCHEMA_VERSION}); upgrade policyhook"
            )
        if int(version) < SCHEMA_VERSION:  # every change so far only added keys
            self._migrate([meta], [SCHEMA_VERSION])
        return bytes(secret)

    def schema_version(self) -> int:
        return int(self._run("schema_version", self._client.hget, self._k["meta"], "version"))

    # -- the Store protocol ---------------------------------------------------------------------

    def secret(self) -> bytes:
        return self._secret

    def put_source(self, source: Source, text: str) -> None:
        entry = Entry.of_source(self._secret, source, text)
        k = self._k
        keys = [*self._held, k["seq"], k["srcinfo"], k["entries"], k["owner"], k["log"]]
        keys.append(k["anchors"])
        ttl_ms = 0 if self.ttl is None else max(1, round(self.ttl * 1000))
        info = entry.digest.encode() + _b(source.kind)
        argv = [_b(source.id), _b(text), ttl_ms, info, entry.digest, _dump(entry)]
        argv.append(entry.anchor or "")
        done = self._run("put_source", self._put_source, keys, argv)
        if isinstance(done, bytes | str):  # the id names another text: nothing was written
            raise SourceIdConflictError.taken(
                source.id, _s(done) if isinstance(done, bytes) else done
            )

    def get_source(self, source_id: str) -> str | None:
        text = self._run("get_source", self._get, self._held, [_b(source_id)])
        return None if text is None else _s(text)

    def get_sources(self, source_ids: Collection[str]) -> dict[str, str]:
        if not source_ids:
            return {}
        flat = self._run("get_sources", self._get_many, self._held, [_b(i) for i in source_ids])
        return {_s(flat[i]): _s(flat[i + 1]) for i in range(0, len(flat), 2)}

    def evict(self, source_id: str) -> bool:
        return bool(self._run("evict", self._evict, self._held, [_b(source_id)]))

    def live(self, source_ids: Collection[str]) -> frozenset[str]:
        if not source_ids:
            return frozenset()
        held = self._run("live", self._live, self._held, [_b(i) for i in source_ids])
        return frozenset(map(_s, held))

    def states(self, source_ids: Collection[str]) -> dict[str, State]:
        if not source_ids:
            return {}
        flat = self._run("states", self._states, self._held, [_b(i) for i in source_ids])
        return {_s(flat[i]): _s(flat[i + 1]) for i in range(0, len(flat), 2)}  # type: ignore[misc]

    def put_summary(self, entry: Entry, text: str, facts: Sequence[FactRecord] = ()) -> Entry:
        """Write `entry`, merged with the text's earlier record if any (compare-and-set), with
        the per-fact provenance (a set of (fact, source) pairs: recording again only adds)."""
        k = self._k
        keys = [k["seq"], k["entries"], k["log"], k["links"], k["stext"], k["windows"]]
        keys += [self._key("win", entry.window), k["anchors"], b""]
        pairs = [_netstrings([f]) + _b(i) for f, ids in facts for i in ids]
        expected = b""
        stored = entry
        for _ in range(16):
            keys[-1] = self._key("facts", stored.id)  # a merged entry keeps the earlier id
            links = _netstrings([str(len(stored.parents)), *stored.parents, *stored.sources])
            argv = [stored.digest, _dump(stored), _b(stored.id), links, _b(text)]
            argv += [_b(stored.window), str(stored.depth), stored.anchor or "", expected, *pairs]
            current = self._run("put_summary", self._put_summary, keys, argv)
            if current is None:
                return stored
            expected, stored = current, entry.merged(_load(current))
        raise StoreUnavailableError(f"{self._where}: put_summary kept racing other writers")

    def facts(self, summary_ids: Collection[str]) -> dict[str, list[FactRecord]]:
        ids = list(dict.fromkeys(summary_ids))
        if not ids:
            return {}
        keys = [self._key("facts", i) for i in ids]
        out: dict[str, list[FactRecord]] = {}
        for summary, fields in zip(ids, self._run("facts", self._facts, keys, []), strict=True):
            by_fact: dict[str, list[str]] = {}
            for field in fields:
                colon = field.index(b":")
                end = colon + 1 + int(field[:colon])
                by_fact.setdefault(_s(field[colon + 1 : end]), []).append(_s(field[end:]))
            if by_fact:
                out[summary] = [(f, tuple(sorted(s))) for f, s in by_fact.items()]
        return out

    def lookup(self, digests: Collection[str]) -> dict[str, Entry]:
        if not digests:
            return {}
        found = self._run("lookup", self._client.hmget, self._k["entries"], list(digests))
        return {e.digest: e for e in map(_load, filter(None, found))}

    def by_anchor(self, anchors: Collection[str]) -> list[Entry]:
        if not anchors:
            return []
        keys = [self._k["entries"], self._k["anchors"]]
        return [_load(e) for e in self._run("by_anchor", self._by_anchor, keys, list(anchors))]

    def rests_on(self, summary_ids: Collection[str]) -> dict[str, frozenset[str]]:
        if not summary_ids:
            return {}
        flat = self._run(
            "rests_on", self._rests_on, [self._k["links"]], [_b(i) for i in summary_ids]
        )
        out: dict[str, set[str]] = {s: set() for s in summary_ids}
        for i in range(0, len(flat), 2):
            out[_s(flat[i])].add(_s(flat[i + 1]))
        return {k: frozenset(v) for k, v in out.items()}

    def window_depth(self, window: str) -> int:
        depth = self._run("window_depth", self._client.hget, self._k["windows"], _b(window))
        return 0 if depth is None else int(depth)

    def since(self, cursor: int, limit: int) -> tuple[int, list[tuple[Entry, str | None]]]:
        k = self._k
        keys = [k["seq"], k["log"], k["entries"], k["stext"], k["owner"], *self._held]
        keys.append(k["srcinfo"])
        flat = self._run("since", self._since, keys, [cursor, limit])
        out = [
            (_load(flat[i + 1]), None if flat[i + 2] is None else _s(flat[i + 2]))
            for i in range(0, len(flat), 3)
        ]
        return (int(flat[-3]) if flat else cursor), out

    def view(
        self,
        cursor: int,
        limit: int,
        digests: Collection[str],
        source_ids: Collection[str],
        window: str | None = None,
    ) -> View:
        """One script (`_VIEW`): since, lookup, the found summaries' closures, liveness of every
        id asked or found, the window's depth; judged on the server's clock."""
        k = self._k
        keys = [k["seq"], k["log"], k["entries"], k["stext"], k["owner"], *self._held]
        keys += [k["srcinfo"], k["links"], k["windows"]]
        argv: list[Any] = [cursor, limit, b"" if window is None else _b(window), len(digests)]
        argv += [*digests, *map(_b, source_ids)]
        since, found, closure, live, depth = self._run("view", self._view, keys, argv)
        entries = {e.digest: e for e in map(_load, found)}
        rests_on: dict[str, set[str]] = {e.id: set() for e in entries.values() if e.depth > 0}
        for i in range(0, len(closure), 2):
            rests_on[_s(closure[i])].add(_s(closure[i + 1]))
        return View(
            cursor=int(since[-3]) if since else cursor,
            since=[
                (_load(since[i + 1]), None if since[i + 2] is None else _s(since[i + 2]))
                for i in range(0, len(since), 3)
            ],
            entries=entries,
            rests_on={key: frozenset(v) for key, v in rests_on.items()},
            live=frozenset(map(_s, live)),
            depth=None if window is None else int(depth),
        )

    def sources(self, limit: int) -> list[tuple[Source, str]]:
        flat = self._run("sources", self._sources, [*self._held, self._k["srcinfo"]], [limit])
        out = []
        for i in range(0, len(flat), 3):
            out.append((Source(_s(flat[i]), _s(flat[i + 1][32:])), _s(flat[i + 2])))
        return out[::-1]

    def summaries(self, window: str, limit: int) -> list[tuple[Region, str]]:
        keys = [self._key("win", window), self._k["entries"], self._k["stext"]]
        flat = self._run("summaries", self._summaries, keys, [limit])
        held = [(_load(flat[i]), _s(flat[i + 1])) for i in range(0, len(flat), 2)][::-1]
        closures = self.rests_on([e.id for e, _ in held])
        return [(e.region(closures[e.id]), t) for e, t in held]
