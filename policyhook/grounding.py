"""Grounding: which facts of a summary rest on a live source, which on none, which were dropped.

A summary can be wrong at depth 1 with every source live: the summarizer writes "retries capped
at 5" where the config said 7. The input-side check cannot see that; this module can. It extracts
the checkable facts of a text deterministically (numbers with the key or unit beside them,
identifiers, hashes, UUIDs, ticket ids, paths, URLs, versions, dates, quoted strings), indexes the
facts of the sources once, when they are recorded, and maps each fact of a summary to the sources
stating it.

A number is checked with its context: "retries capped at 5" is the fact (5, {retry, cap}) and is
grounded only by a source that states 5 next to one of those words. A bare "5" somewhere in a
300 KB history grounds nothing. Identifiers, paths, URLs, versions, dates and quotes identify
themselves and are checked verbatim (after normalisation).

The check is linear in the summary; indexing is linear in the sources and done once per source.
Nothing here imports the policy engine or the hook: they build on it.
"""

from __future__ import annotations

import functools
import itertools
import json
import operator
import re
import sys
import threading
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = [
    "KINDS",
    "CheckerUnavailable",
    "Fact",
    "FactIndex",
    "Grounding",
    "Judge",
    "check",
    "cite",
    "extract",
    "nli_judge",
]

#: Every kind of fact the extractor reports, in the order policies see them.
KINDS = (
    "number",
    "identifier",
    "path",
    "url",
    "version",
    "date",
    "hash",
    "uuid",
    "ticket",
    "quote",
    "claim",  # a sentence an optional heavier checker (`judge=`) found no source to support
)

#: Content words taken as a number's context: this many before it and this many after it, never
#: across a line or sentence break.
_BEFORE = 4
_AFTER = 3

_EXTENSIONS = (
    "py|pyi|ts|tsx|js|jsx|mjs|cjs|json|jsonl|ya?ml|toml|ini|cfg|conf|md|rst|txt|csv|sql|sh|bash|"
    "go|rs|rb|java|kt|swift|c|h|cc|cpp|hpp|cs|php|html|css|scss|lock|env|log|xml|proto|tf|r|R|"
    "ipynb|svg|png|jpg|pdf|tex|cls|bib|dockerfile|gradle|vue|svelte|ex|exs|heex|eex|erl"
)
_MONTHS = {
    m[:3]: i + 1
    for i, m in enumerate(
        [
            "january",
            "february",
            "march",
            "april",
            "may",
            "june",
            "july",
            "august",
            "september",
            "october",
            "november",
            "december",
        ]
    )
}
_WORD_NUMBERS = {
    w: i
    for i, w in enumerate(
        [
            "zero",
            "_",
            "two",
            "three",
            "four",
            "five",
            "six",
            "seven",
            "eight",
            "nine",
            "ten",
            "eleven",
            "twelve",
            "thirteen",
            "fourteen",
            "fifteen",
            "sixteen",
            "seventeen",
            "eighteen",
            "nineteen",
            "twenty",
        ]
    )
    if w != "_"
}
_WORD_NUMBERS.update(
    {
        w: 10 * (i + 3)
        for i, w in enumerate(["thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"])
    }
)

#: Units folded to one base so `5s` = `5 seconds` = `5000ms`; (base unit, factor).
_UNITS: dict[str, tuple[str, Decimal]] = {}
for _names, _base, _factor in (
    ("ms msec msecs millisecond milliseconds", "s", "0.001"),
    ("us µs microsecond microseconds", "s", "0.000001"),
    ("s sec secs second seconds", "s", "1"),
    ("m min mins minute minutes", "s", "60"),
    ("h hr hrs hour hours", "s", "3600"),
    ("d day days", "s", "86400"),
    ("b byte bytes", "B", "1"),
    ("kb kilobyte kilobytes", "B", "1000"),
    ("kib", "B", "1024"),
    ("mb megabyte megabytes", "B", "1000000"),
    ("mib", "B", "1048576"),
    ("gb gigabyte gigabytes", "B", "1000000000"),
    ("gib", "B", "1073741824"),
    ("tb", "B", "1000000000000"),
    ("k", "", "1000"),
    ("% percent pct", "%", "1"),
    ("x", "x", "1"),
):
    for _name in _names.split():
        _UNITS[_name] = (_base, Decimal(_factor))
#: Units named by the last word of a key (`timeout_seconds`, `size_kb`), by their stem.
_KEY_UNITS = {n: u for n, u in _UNITS.items() if len(n) > 1 and n.isalpha()}
_SPACED_UNITS = (
    r"milliseconds?|msecs?|ms|microseconds?|seconds?|secs?|minutes?|mins?|hours?|hrs?|days?"
    r"|bytes?|[KMGT]i?B|[kmg]b|kilobytes?|megabytes?|gigabytes?|s|h"
)

_STOP = frozenset(
    [
        "a",
        "an",
        "the",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "being",
        "am",
        "to",
        "of",
        "in",
        "on",
        "at",
        "by",
        "for",
        "with",
        "from",
        "and",
        "or",
        "nor",
        "not",
        "no",
        "it",
        "its",
        "this",
        "that",
        "these",
        "those",
        "as",
        "than",
        "then",
        "so",
        "if",
        "per",
        "each",
        "all",
        "any",
        "up",
        "down",
        "into",
        "over",
        "under",
        "about",
        "after",
        "before",
        "we",
        "i",
        "you",
        "he",
        "she",
        "they",
        "them",
        "our",
        "my",
        "your",
        "his",
        "her",
        "their",
        "has",
        "have",
        "had",
        "do",
        "does",
        "did",
        "will",
        "would",
        "can",
        "could",
        "should",
        "may",
        "might",
        "must",
        "also",
        "only",
        "just",
        "now",
        "still",
        "there",
        "here",
        "which",
        "what",
        "when",
        "where",
        "who",
        "whom",
        "how",
        "set",
        "value",
        "values",
        "some",
        "more",
        "most",
        "less",
        "least",
        "very",
        "via",
        "using",
        "use",
        "used",
        "while",
        "out",
        "off",
        "both",
        "same",
        "other",
        "such",
        "own",
        "too",
        "again",
        "once",
        "let",
        "lets",
        "me",
        "us",
        "but",
        "yet",
    ]
)

# One pass, alternatives in priority order. Quantifiers are possessive (`++`, `*+`) wherever a
# backtrack could only fail again, and a plain word followed by a space is taken first: this is
# what keeps the scan linear and fast on long histories.
_FACT_RE = re.compile(
    r"""
    (?=[^\x20\t\r])
    (?:
    (?P<url>\b(?:https?|ftp|wss?)://[^\s<>"'`)\]}]++)
  | (?P<arity>\b[A-Za-z_][\w.]*+[!?]?/\d{1,2}(?![\w/.]))
  | (?P<uuid>\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b)
  | (?P<date>\b\d{4}-\d{2}-\d{2}
        (?:[T\x20]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?\b
      | \b(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*+\.?
        \x20\d{1,2}(?:st|nd|rd|th)?,?\x20\d{4}\b
      | \b\d{1,2}\x20(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*+\.?,?\x20\d{4}\b)
  | (?P<word>[A-Za-z][a-z']*+(?=[\s,;!?)\]}"'`*]|\Z))
  | (?P<path>(?<![\w<>])(?:~|\.\.?)?/(?:[\w.@+-]++/)*+[\w.@+-]*[\w@+-](?::\d+(?::\d+)?)?
      | [\w.@+-]++(?:/[\w.@+-]++){2,}/?(?::\d+(?::\d+)?)?
      | [\w.@+-]++/[\w@+-]*+\.[A-Za-z]\w*+(?::\d+(?::\d+)?)?
      | \b[\w-]++(?:\.[\w-]++)*\.(?:"""
    + _EXTENSIONS
    + r""")\b(?::\d+(?::\d+)?)?)
  | (?P<version>\bv?\d++\.\d++\.\d++(?:[-+][0-9A-Za-z.-]*[0-9A-Za-z]|\.\d+)*+\b|\bv\d++(?:\.\d+)?\b)
  | (?P<hash>\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,64}\b)
  | (?P<ticket>\b[A-Z][A-Z0-9]*+-\d++\b|(?<![\w&])\#\d++\b)
  | (?P<identifier>(?<![\w-])--?[A-Za-z][\w-]*+
      | \b_*+[A-Za-z$][A-Za-z0-9$]*+_[\w$]++
      | \b[a-z][a-z0-9]*+[A-Z][\w$]*+
      | \b[A-Z][a-z0-9]++[A-Z][\w$]*+
      | \b[A-Za-z][A-Za-z0-9]*+(?:-[A-Za-z0-9]++){2,}\b
      | \b(?:[a-z]|[A-Za-z]{2,}+)\d\w*+
      | \b[a-z]++\d[a-z0-9]*+(?:-[a-z0-9]++)++\b|\b[a-z][a-z0-9]*+(?:-[a-z]*+\d[a-z0-9]*+)++\b
      | \b[a-z_][a-z0-9_]++(?:\.[a-z_][a-z0-9_]++){2,}\b)
  | (?P<number>(?<![\w.])(?:\d{1,3}(?:,\d{3})++|\d++)(?:\.\d++)?(?:[eE][-+]?\d++)?(?:/\d++)?
        (?:\x20?%|(?P<glued>[A-Za-z]++)\b|\x20(?P<spaced>"""
    + _SPACED_UNITS
    + r""")\b)?(?![\w.]\w))
  | (?P<other>[A-Za-z][A-Za-z']*+|\d\w*+)
    )
    """,
    re.VERBOSE,
)


@functools.cache
def _copy_bytes(n: int) -> int:
    """The size of a copy of a set of `n` members: what FactIndex.trim compacts an id set to
    (only when it is larger, so a compacted set is not compacted again). Asked for powers of
    two only, so the cache holds a few dozen sizes."""
    return sys.getsizeof(set(set(range(n))))


#: Paths are indexed by their last this many components (a deeper mention is cut to them).
_PATH_DEPTH = 10
#: Punctuation around a chunk (a run of non-space characters) that does not make it a fact.
_PUNCT = "()[]{}<>\"'`,.;:!?*"
#: Chunks known to be plain words (see _plain_word) and chunks known not to be, so a chunk seen
#: before costs one set lookup; caches, each cleared when full (a size, not contents, bounds them).
_PLAIN: set[str] = set()
_NOT_PLAIN: set[str] = set()
_PLAIN_MAX = 1 << 12
#: A character a fact can start with (every alternative of _FACT_RE starts with one of them).
_START_RE = re.compile(r"[\w~./@+#$-]")
_CONTEXT_RE = re.compile(r"[A-Za-z_$][\w$]*")
_BREAK_RE = re.compile(r"\n|[.;!?](?=\s)")
_SENTENCE_ENDS = (". ", "; ", "! ", "? ", ".\t", ";\t")
#: Facts of a source a summary should keep: `key: value` numbers and these kinds.
_KEY_KINDS = frozenset(("version", "hash", "uuid", "ticket"))
#: A rate after a number: `600 requests per minute`, `2,300 req/s`.
_RATE_RE = re.compile(
    r"\s*(?:[A-Za-z]+\s+){0,2}?(?:[A-Za-z]*/|per\s+|an?\s+)"
    r"(ms|s|sec|second|m|min|minute|h|hr|hour|d|day)\b",
    re.IGNORECASE,
)
#: How far past its chunk a fact may reach (`5 seconds`, `Jan 5, 2025`).
_SPILL = 16
#: How far (in characters) a number's context is looked for on each side.
_WINDOW = 100
#: Where the words between two numbers change hands (see _numbers).
_SPLIT_RE = re.compile(r"[,;]|\b(?:and|or|but|across|while|then|plus|versus|vs)\b")
_RANGE_JOINS = frozenset(
    [
        *(
            "-",
            "\u2013",
            "\u2014",
            " - ",
            " \u2013 ",
            " to ",
            "..",
            " and ",
            " or ",
            "/",
            ", ",
            ",",
        ),
        *(" > ", " < ", " >= ", " <= ", " of ", " vs ", " -> ", " \u2192 "),  # `(13 > 9)`, `3 of 4`
    ]
)
_QUOTE_RE = re.compile(r'"([^"\n]{2,300})"|“([^”\n]{2,300})”|`([^`\n]{2,300})`')
_SPACE_RE = re.compile(r"\s")
_ELISION_RE = re.compile(r"\[[^\]]*\]|\.{3,}|…")
_WORDS_RE = re.compile(r"\w+")
_TOKEN_RE = re.compile(r"[\w$@]+(?:[-.:][\w$@]+)*")
_LETTER_DIGIT_RE = re.compile(r"[A-Za-z]+\d+[A-Za-z\d]*")
_CAMEL_RE = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")


@dataclass(slots=True)  # not frozen: a frozen __init__ costs 3x on hot paths
class Fact:
    """One checkable fact: its kind, its normalised value, and (for numbers) its context words.

    `text` and `start`/`end` say where it was written; they are not part of its identity, so the
    same fact written twice is one fact.
    """

    kind: str
    value: str
    context: frozenset[str] = frozenset()
    key: str = ""  # the words before it as written, for people ("retries capped")
    text: str = field(default="", compare=False)
    start: int = field(default=0, compare=False)
    end: int = field(default=0, compare=False)
    assigned: bool = field(default=False, compare=False)  # written as `key: value` / `key = value`
    bare: str = field(default="", compare=False)  # a number as written, without its unit
    #: a number that points (`Message 3`, `items 10.1-10.4`, `line 3`, `2.2 R2 Storage`) rather
    #: than counts or measures: a source states it, a summary's own is not checked
    reference: bool = field(default=False, compare=False)
    #: the hash of (kind, value, context, key), computed once: facts are hashed many times per
    #: check (deduplicated, looked up, kept or dropped); the fields it covers are never changed
    _hash: int = field(default=0, init=False, compare=False, repr=False)

    def __hash__(self) -> int:
        if not self._hash:
            self._hash = hash((self.kind, self.value, self.context, self.key))
        return self._hash

    def __str__(self) -> str:
        if self.kind == "number" and self.key:
            return f"{self.key} {self.text or self.value}"
        return self.text or self.value


def _stem(word: str) -> str:
    """A crude English stem, enough that "retries", "retry" and "retrying", or "phases" and
    "phase", meet: only consistency matters, both sides are stemmed alike."""
    w = word.lower()
    if len(w) > 4 and w.endswith(("ies", "ied")):
        return w[:-3] + "y"
    if len(w) > 5 and w.endswith("ing"):
        w = w[:-3]
    elif len(w) > 4 and w.endswith(("ed", "sses", "xes", "ches", "shes", "zes")):
        w = w[:-2]
    elif len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
        w = w[:-1]
    if len(w) > 3 and w[-1] == "e":
        w = w[:-1]  # phase, phases -> phas; create, created -> creat
    if len(w) > 3 and w[-1] == w[-2] and w[-1] not in "aeiouls":
        w = w[:-1]  # capped -> capp -> cap
    return w


@functools.lru_cache(maxsize=1 << 14)
def _parts(token: str) -> tuple[str, ...]:
    """Content words of a token: `retry_ceiling` -> retry, ceiling; `maxRetries` -> max, retries."""
    if token.isalpha() and token.islower():
        return () if token in _STOP or len(token) < 2 else (_stem(token),)
    words = [_stem(w) for w in _CAMEL_RE.findall(token) if w.isalpha() and w.lower() not in _STOP]
    if _LETTER_DIGIT_RE.fullmatch(token):
        words.append(token.lower())  # `p99`, `ec2`, `utf8` name what they are
    return tuple(w for w in words if len(w) > 1)


def _decimal(text: str) -> Decimal | None:
    try:
        return Decimal(text.replace(",", ""))
    except InvalidOperation:
        return None


def _plain(d: Decimal) -> str:
    """`1000`, `1e3` and `1,000.0` all print as `1000`; `0.25` stays `0.25`."""
    try:
        if d == d.to_integral_value():
            return str(d.quantize(Decimal(1)))
        return format(d.normalize(), "f")
    except InvalidOperation:  # more digits than the context's precision: keep them as written
        return str(d)


@functools.lru_cache(maxsize=4096)
def _number(digits: str, unit: str | None) -> tuple[str, str]:
    """(value with its unit folded to the base unit, the bare number as written, normalised).

    Cached: the same few numbers and units recur in every text, and Decimal is not cheap."""
    if "/" in digits:
        a, _, b = digits.partition("/")
        bare = f"{_plain(_decimal(a) or Decimal(0))}/{_plain(_decimal(b) or Decimal(0))}"
        return bare, bare
    d = _decimal(digits)
    if d is None:
        return digits, digits
    bare = _plain(d)
    if not unit:
        return bare, bare
    folded = _UNITS.get(unit if unit in ("%",) else unit.lower())
    if unit in ("M",):
        folded = ("", Decimal(1000000))
    if folded is None:
        return f"{bare} {unit.lower()}", bare
    base, factor = folded
    value = _plain(d * factor)
    return (f"{value} {base}", bare) if base else (value, value)


def _date(text: str) -> str:
    if text[:4].isdigit():
        return text[:10]
    m = re.match(r"(?:(\d{1,2})\s)?([A-Za-z]+)\.?\s?(\d{1,2})?\D*(\d{4})", text)
    if not m:
        return text
    day = m.group(1) or m.group(3) or "0"
    return f"{m.group(4)}-{_MONTHS.get(m.group(2)[:3].lower(), 0):02d}-{int(day):02d}"


_LINE_SUFFIX_RE = re.compile(r":\d+(?::\d+)?$")


def _path(text: str) -> str:
    return _LINE_SUFFIX_RE.sub("", text.rstrip(".,"))


def _url(text: str) -> str:
    return text.rstrip(".,;:!?").rstrip("/")


def _quote_value(inner: str) -> str:
    return " ".join(_WORDS_RE.findall(inner.lower()))


def _idiom(raw: str) -> bool:
    """`end-to-end`, `belt-and-suspenders`: hyphenated English, not an identifier."""
    return raw.islower() and any(part in _STOP for part in raw.split("-"))


def _assigned(text: str, start: int) -> bool:
    """Whether the number at `start` is written as `key: value` or `key = value`."""
    i = start - 1
    while i >= 0 and text[i] in " \t\"'":
        i -= 1
    if i < 1 or text[i] not in ":=":
        return False
    i -= 1
    while i >= 0 and text[i] in " \t\"':":
        i -= 1
    return i >= 0 and (text[i].isalnum() or text[i] == "_")


def _context(segment: str) -> list[tuple[str, str]]:
    """(stem, token as written) of every content word of `segment`."""
    return [(w, tok) for tok in _CONTEXT_RE.findall(segment) for w in _parts(tok)]


def _first_context(segment: str, n: int) -> list[tuple[str, str]]:
    """`_context(segment)[:n]`, without stemming the words after them."""
    out: list[tuple[str, str]] = []
    for tok in _CONTEXT_RE.findall(segment):
        out.extend([(w, tok) for w in _parts(tok)])
        if len(out) >= n:
            break
    return out[:n]


def _last_context(segment: str, n: int) -> list[tuple[str, str]]:
    """`_context(segment)[-n:]`, without stemming the words before them."""
    out: list[tuple[str, str]] = []
    for tok in reversed(_CONTEXT_RE.findall(segment)):
        parts = _parts(tok)
        if parts:
            out[:0] = [(w, tok) for w in parts]
            if len(out) >= n:
                break
    return out[-n:] if n else []


#: A number found by the scan: start, end, as written, value, bare, whether it names a section.
_Number = tuple[int, int, str, str, str, bool]


def _is_marker(text: str, start: int, end: int) -> bool:
    """A list marker (`1.`, `2)` or `2.1:` starting a line, `(3)`): the summarizer's numbering,
    no fact."""
    after = text[end : end + 2]
    if start > 0 and text[start - 1] == "(" and after[:1] == ")":
        # `(3)` numbers a list; `timeout(3000)` passes an argument
        return start < 2 or not (text[start - 2].isalnum() or text[start - 2] in "_$.")
    if after[:1] == "\u2192":  # `  42→code`: the line-number gutter of a file read
        return True
    if after[:1] not in (".", ")", ":") or after[1:2] not in ("", " ", "\t", "\n"):
        return False
    line = text[text.rfind("\n", 0, start) + 1 : start]
    return line.strip(" \t#*-") == ""


def _is_section(text: str, start: int, end: int) -> bool:
    """`2.2 R2 Storage`, `### 10.4 Add mathrsfs`: a dotted number before a title names a section."""
    raw = text[start:end]
    return (
        "." in raw
        and text[end : end + 1] == " "
        and text[end + 1 : end + 2].isupper()
        and raw.replace(".", "").isdigit()
    )


def _plain_word(chunk: str) -> bool:
    """Whether a chunk is a plain word no fact starts in: letters only (lower, Capitalized or
    UPPER) inside punctuation, and neither a word number nor a month; or a lone character."""
    core = chunk.strip(_PUNCT)
    if len(core) < 2:
        return not core.isdigit()
    if not core.isalpha() or not (core.islower() or core[1:].islower() or core.isupper()):
        return False
    low = core.lower()
    return low not in _WORD_NUMBERS and low[:3] not in _MONTHS


def _chunks(text: str) -> list[tuple[int, str]]:
    """(start, chunk) of every whitespace-separated chunk of `text` that is no plain word.

    `str.split` finds the chunks without a match object each, and a chunk seen before costs
    one set lookup; only the chunks left are located in the text."""
    plain = _PLAIN
    find = text.find
    size = len(text)
    at = 0
    out = []
    other = _NOT_PLAIN
    for chunk in [c for c in text.split() if c not in plain]:
        if chunk not in other:
            known = plain if _plain_word(chunk) else other
            if len(known) >= _PLAIN_MAX:
                known.clear()
            known.add(chunk)
            if known is plain:
                continue
        # the next occurrence that is a whole chunk (`march` also occurs in `xmarch`)
        at = find(chunk, at)
        n = len(chunk)
        while (at > 0 and not text[at - 1].isspace()) or (
            at + n < size and not text[at + n].isspace()
        ):
            at = find(chunk, at + 1)
        out.append((at, chunk))
        at += n
    return out


def _scan(text: str) -> Iterator[Fact]:
    """Every fact of `text`, left to right.

    Plain words (the bulk of any text) are skipped by a cheap test on whitespace-separated
    chunks; the fact expression runs only where a chunk has digits, slashes, underscores,
    inner capitals or punctuation. A number's context is read afterwards from the words around
    it, never across a line or sentence break or past a neighbouring number.
    """
    numbers: list[_Number] = []
    skip_until = 0
    match = _FACT_RE.match
    first = _START_RE.search
    size = len(text)
    for start, chunk in _chunks(text):
        end = start + len(chunk)
        if start < skip_until:
            continue
        core = chunk.strip(_PUNCT)
        if core.isalpha() and (core.islower() or core[1:].islower() or core.isupper()):
            n = _WORD_NUMBERS.get(core.lower())
            if n is not None:  # `seven`; a month goes on to the expression
                at = start + chunk.find(core)
                numbers.append((at, at + len(core), core, str(n), str(n), False))
                continue
        pos = end
        limit = min(size, end + _SPILL)
        at = start
        # the facts starting in the chunk (they may reach past it): the leftmost match at or
        # after `at`, as a search would find it, without searching on past the chunk's end
        while at < end:
            s = first(text, at, end)
            if s is None:
                break
            m = match(text, s.start(), limit)
            if m is None:
                at = s.start() + 1
                continue
            at = pos = m.end()
            group = m.lastgroup
            raw = m.group()
            if group == "other" or group == "word":
                continue
            if group == "number":
                dotted = "." in raw.rstrip(".")
                if _is_marker(text, m.start(), m.end()) and not dotted:
                    continue
                spaced = m.group("spaced")
                glued = m.group("glued")
                unit = "%" if raw.endswith("%") else (spaced or glued)
                digits = raw[: len(raw) - len(spaced) - 1] if spaced else raw
                digits = digits[: len(digits) - len(glued)] if glued else digits.rstrip(" %")
                value, bare = _number(digits, unit)
                # `- **10.3**: network isolation`, `2.2 R2 Storage`: a section's number
                section = _is_section(text, m.start(), m.end()) or (
                    dotted and _is_marker(text, m.start(), m.end())
                )
                numbers.append((m.start(), m.end(), raw, value, bare, section))
                continue
            if group == "arity":  # `create_refs/2`, `upsert!/4`: a function by name and arity;
                group = "identifier"  # sources define it by name, its arity is no number
                value = raw.partition("/")[0].rstrip("!?")
            elif group == "path":
                value = _path(raw)
                if value.strip("./~") == "":
                    continue
            elif group == "url":
                value = _url(raw)
            elif group == "date":
                value = _date(raw)
            elif group == "version":
                value = raw.removeprefix("v")
            elif group == "uuid" or group == "hash":
                value = raw.lower()
            elif group == "identifier" and "-" in raw[1:] and _idiom(raw):
                continue
            else:
                value = raw
            assert group is not None
            yield Fact(group, value, text=raw, start=m.start(), end=m.end())
        skip_until = max(pos, end)
    yield from _numbers(text, numbers)


def _last_break(segment: str) -> int:
    """Where the words after the last line or sentence break of `segment` start (0 if none)."""
    cut = segment.rfind("\n") + 1
    for mark in _SENTENCE_ENDS:
        at = segment.rfind(mark, cut)
        if at >= 0:
            cut = at + 2
    return cut


def _implied_unit(
    value: str, before: list[tuple[str, str]], after: list[tuple[str, str]], following: str
) -> str:
    """A unitless number's unit when its words give it: `timeout_seconds: 30` is 30 s,
    `5  # seconds` is 5 s, `600 requests per minute` is 10 /s."""
    rate = _RATE_RE.match(following)
    unit = (
        before[-1][0]
        if before and before[-1][0] in _KEY_UNITS
        else after[0][0]
        if after and after[0][0] in _KEY_UNITS
        else None
    )
    if rate is None and unit is None:
        return value  # the common case, decided without a Decimal
    d = _decimal(value)
    if d is None:
        return value
    if rate:
        base, factor = _UNITS[rate.group(1).lower()]
        return f"{_plain(d / factor)} /{base}"
    assert unit is not None
    base, factor = _KEY_UNITS[unit]
    return f"{_plain(d * factor)} {base}"


#: Nouns that make the number after them a reference, not a quantity: "Message 3", "Phase 2",
#: "items 10.1-10.4", "line 3", "§4.1". A summarizer numbers its own structure and points into
#: documents with them; such a number claims where something is, not how much of it there is.
_LABELS = frozenset(
    _stem(w)
    for w in [
        "message",
        "request",
        "response",
        "reply",
        "turn",
        "step",
        "phase",
        "stage",
        "section",
        "chapter",
        "part",
        "item",
        "point",
        "question",
        "option",
        "tier",
        "line",
        "page",
        "figure",
        "fig",
        "table",
        "appendix",
        "example",
        "round",
        "task",
        "summary",
        "pass",
        "level",
    ]
)


def _is_reference(before: str) -> bool:
    """Whether the text just before a number ends with a label noun or `§` (see _LABELS)."""
    return _reference_label(before) >= 0


def _reference_label(before: str) -> int:
    """Where the label noun (or `§`) that `before` ends with starts; -1 if it ends with none."""
    tail = before.rstrip(" \t*_(#")
    end = len(tail)
    if end and tail[-1] == "§":
        return end - 1
    i = end
    while i and tail[i - 1].isascii() and tail[i - 1].isalpha():
        i -= 1
    if i == end or (i and tail[i - 1].isalnum()) or not _is_label(tail[i:end]):
        return -1
    return i


@functools.lru_cache(maxsize=4096)
def _is_label(word: str) -> bool:
    return _stem(word) in _LABELS


def _numbers(text: str, numbers: list[_Number]) -> Iterator[Fact]:
    """The numbers of `text` as facts, each with the content words around it.

    Words between two numbers are split at the first comma, conjunction or preposition: those
    before it describe the first number, those after it the second ("5 new files and 4
    modifications": files are 5's, modifications 4's; "7 retries, backoff 2s")."""
    prev_end, prev_before, prev_unit, prev_ref = 0, list[tuple[str, str]](), "", False
    for i, (start, end, raw, value, bare, section) in enumerate(numbers):
        lo = max(prev_end, start - _WINDOW)
        segment = text[lo:start]
        gap = text[prev_end:start]
        # `items 10.1-10.4`, `lines 1-200, then 200-700`: a range shares the reference
        reference = section or (
            value == bare  # `step 5s` measures
            and ((prev_ref and len(gap) <= 8 and not _context(gap)) or _is_reference(segment))
        )
        cut = _last_break(segment)
        if i and lo == prev_end:
            split = _SPLIT_RE.search(segment, cut)
            cut = split.end() if split else cut
        before = _last_context(segment[cut:], _BEFORE)
        unit = value.partition(" ")[2]
        same = unit == prev_unit or not unit or not prev_unit
        if not before and same and text[prev_end:start] in _RANGE_JOINS:
            before = prev_before  # `lines 174-185`, `5min, 30min, 1h`: a range or list
        hi = numbers[i + 1][0] if i + 1 < len(numbers) else len(text)
        if hi - end <= _WINDOW:
            label = _reference_label(text[end:hi])
            hi = hi if label < 0 else end + label  # `(was 3) at line 152`: not 3's words
        segment = text[end : min(hi, end + _WINDOW)]
        stop = _BREAK_RE.search(segment)
        if i + 1 < len(numbers) and hi - end <= _WINDOW:
            stop = _SPLIT_RE.search(segment[: stop.start()] if stop else segment) or stop
        after = _first_context(segment[: stop.start()] if stop else segment, _AFTER)
        prev_end, prev_before, prev_unit, prev_ref = end, before, unit, reference
        words = [w for w, _ in before] + [w for w, _ in after]
        if unit and unit not in _BASES and not unit.startswith("/"):
            words.append(_stem(unit))  # `<32hex>`: a word glued to a number is its context too
        context = frozenset(words)
        if not context and value == bare:
            continue  # a number with no word and no unit cannot be checked: "5" grounds nothing
        if value == bare:
            value = _implied_unit(value, before, after, segment)
        yield Fact(
            "number",
            value,
            context,
            key=" ".join(dict.fromkeys(tok for _, tok in before[-3:])),
            text=raw,
            start=start,
            end=end,
            assigned=_assigned(text, start),
            bare=bare,
            reference=reference,
        )


def _quotes(text: str) -> Iterator[Fact]:
    for m in _QUOTE_RE.finditer(text):
        inner = m.group(m.lastindex or 0)  # the one of the three forms that matched
        if m.lastindex == 3 and _SPACE_RE.search(inner) is None:
            continue  # a code span of one token is checked as what it is (identifier, path, …)
        # an elision ("... [full plan] ...") splits a quote into the parts actually quoted
        for part in _ELISION_RE.split(inner):
            value = _quote_value(part)
            if " " in value:  # a single word is checked as what it is (identifier, number, …)
                yield Fact("quote", value, text=m.group(), start=m.start(), end=m.end())


def extract(text: str) -> tuple[Fact, ...]:
    """The checkable facts of `text`, in order of appearance (each distinct fact once)."""
    facts = sorted((*_scan(text), *_quotes(text)), key=_START)
    return tuple(dict.fromkeys([f for f in facts if not f.reference]))


_START = operator.attrgetter("start")


def _is_key(fact: Fact) -> bool:
    """A fact a summary of its source must keep (else it is reported dropped)."""
    return (fact.kind == "number" and fact.assigned) or fact.kind in _KEY_KINDS


def _keys_of(fact: Fact) -> list[str]:
    """The index keys that find `fact` (FactIndex.sources_of looks them up)."""
    keys: list[str]
    if fact.kind == "number":
        keys = ["n" + fact.value + "\0" + w for w in fact.context]
        if fact.bare and fact.bare != fact.value:  # stated with a unit
            keys += ["b" + fact.bare + "\0" + w for w in fact.context]
            keys.append("v" + fact.value)
        elif len(fact.value) >= 4 and fact.value.isdigit() and not _TIME.isdisjoint(fact.context):
            # `AbortSignal.timeout(3000)`, `sleep_ms(1500)`: a duration of 1000 or more with
            # no unit is, by the convention of most APIs, milliseconds; "3s timeout" is it
            seconds = _plain(Decimal(fact.value) / 1000)
            keys += ["n" + seconds + " s\0" + w for w in fact.context]
    elif fact.kind == "path":
        # every run of consecutive components, so `lib/x.ts` and `apps/web` are found in
        # `/home/dev/apps/web/lib/x.ts` with one lookup
        parts = _components(fact.value)[-_PATH_DEPTH:]
        n = len(parts)
        keys = ["p" + "/".join(parts[i:j]) for i in range(n) for j in range(i + 1, n + 1)]
    else:
        keys = [fact.kind[0] + ":" + fact.value, "t" + fact.value]
        if fact.kind == "hash":  # an abbreviated hash is a prefix of the full one
            keys += ["h:" + fact.value[:n] for n in range(7, len(fact.value))]
    return keys


class FactIndex:
    """The facts of a set of sources, indexed once so a summary can be checked in linear time.

    Numbers are indexed by (value, context word); everything else by its normalised value; every
    token and word pair of a source's text is indexed too, so an identifier or quote the
    extractor classified differently in the source (a name inside a path) is still found.
    Which sources are live is asked at check time: a fact found only in dead sources is
    unverifiable, not ungrounded. With `max_sources`, the index is a cache: `trim` forgets the
    least recently used sources beyond it (their texts are in the store, to be indexed again
    when needed), so a long-running guard's memory stays bounded.
    """

    def __init__(self, max_sources: int | None = None) -> None:
        if max_sources is not None and max_sources < 1:
            raise ValueError(f"max_sources must be at least 1, got {max_sources}")
        self.max_sources = max_sources
        self._lock = threading.Lock()  # a check may run while another thread records a source
        self._keys: dict[str, set[str]] = {}
        self._assigned: dict[str, list[Fact]] = {}
        # every id that put keys here (an indexed source, or one `add_facts` named), least
        # recently used first, with the keys it put: what `trim` counts and forgets
        self._owned: dict[str, set[str]] = {}
        # each indexed source's words, lowercased, one space apart; its ids are the indexed sources
        self._norm: dict[str, str] = {}

    def __contains__(self, source_id: object) -> bool:
        return source_id in self._norm

    def __len__(self) -> int:
        return len(self._norm)

    def _own(self, source_id: str, keys: Iterable[str]) -> None:
        """Put `source_id` under each of `keys`, and remember that it did (to forget it)."""
        owned = self._owned.get(source_id)
        if owned is None:
            owned = self._owned[source_id] = set()
        new = set(keys) - owned
        owned |= new
        index = self._keys
        for key in new:
            ids = index.get(key)
            if ids is None:
                index[key] = {source_id}
            else:
                ids.add(source_id)

    def trim(self, keep: Collection[str] = ()) -> int:
        """Forget the least recently used ids beyond `max_sources`, except those in `keep`
        (the ones a check is using), which become the most recent. Returns how many it forgot.

        Every key an id put goes with it, and an id set left much larger than its members
        need is rebuilt (a Python set never shrinks by itself): what the index holds stays
        proportional to what it keeps, however many sources went through it."""
        with self._lock:
            owned = self._owned
            for source_id in keep:
                put = owned.pop(source_id, None)
                if put is not None:
                    owned[source_id] = put
            if self.max_sources is None:
                return 0
            excess = len(owned) - max(self.max_sources, len(keep))
            forgotten = list(itertools.islice(owned, max(excess, 0)))
            index = self._keys
            for source_id in forgotten:
                for key in owned.pop(source_id):
                    ids = index[key]
                    ids.discard(source_id)
                    n = len(ids)
                    if not n:
                        del index[key]
                    elif n & (n - 1) == 0 and sys.getsizeof(ids) > _copy_bytes(n):
                        index[key] = set(ids)  # shrunk to a power of two, table oversized
                self._norm.pop(source_id, None)
                self._assigned.pop(source_id, None)
            return len(forgotten)

    def add(self, source_id: str, text: str, must_keep: str | None = None) -> None:
        """Index the facts, tokens and words of one source's text.

        `must_keep`: the part of `text` whose key facts a summary must keep (`text` with the
        rest blanked), when not all of it: what reaches the summary verbatim anyway (a remedy's
        pointer, carried) is not dropped by a summary that leaves it out. Every fact of `text`
        still grounds the facts an output states."""
        if not isinstance(source_id, str) or not isinstance(text, str):
            msg = (
                f"source id and text must be str: {type(source_id).__name__}, {type(text).__name__}"
            )
            raise TypeError(msg)
        with self._lock:
            self._add(source_id, text, must_keep)

    def _add(self, source_id: str, text: str, must_keep: str | None = None) -> None:
        if source_id in self._norm:
            return
        keys = {"t" + token for token in _TOKEN_RE.findall(text)}
        keys.update(["t" + k[1:].rsplit(".", 1)[0] for k in keys if "." in k])
        words = _WORDS_RE.findall(text)
        keys.update(["t" + w for w in words])
        lowered = " ".join(words).lower()
        keys.update(["w" + w for w in lowered.split()])
        self._norm[source_id] = " " + lowered + " "
        assigned = []
        for fact in _scan(text):
            keys.update(_keys_of(fact))
            if _is_key(fact):
                assigned.append(fact)
        for fact in _counts(text):  # what a source states by its shape: lines, list items
            keys.update(_keys_of(fact))
        if must_keep is not None:
            assigned = [fact for fact in _scan(must_keep) if _is_key(fact)]
        self._own(source_id, keys)
        if assigned:
            self._assigned[source_id] = assigned

    def add_facts(self, facts: Iterable[tuple[Fact, Collection[str]]]) -> None:
        """Index facts whose sources are already known (the provenance of an earlier summary)."""
        with self._lock:
            self._add_facts(facts)

    def _add_facts(self, facts: Iterable[tuple[Fact, Collection[str]]]) -> None:
        by_id: dict[str, list[str]] = {}
        for fact, ids in facts:
            keys = _keys_of(fact)
            for sid in ids:
                by_id.setdefault(sid, []).extend(keys)
        for sid, keys in by_id.items():
            self._own(sid, keys)

    def sources_of(self, fact: Fact) -> frozenset[str]:
        """Ids of the indexed sources that state `fact` (live or not)."""
        get = self._keys.get
        found: set[str] = set()
        if fact.kind == "number":
            if not fact.context:  # `95 seconds` on its own: found by value and unit
                return frozenset(get("v" + fact.value, ()))
            for w in fact.context:
                found.update(get("n" + fact.value + "\0" + w, ()))
            if not found and fact.bare == fact.value:
                # `timeout 30` is stated by `timeout: 30s` (the summary left the unit out); a
                # unit the source does not give (`30s` for `timeout: 30`) or a swapped one (`5s`
                # for `5ms`) is stated by nothing
                for w in fact.context:
                    found.update(get("b" + fact.bare + "\0" + w, ()))
            if not found and fact.value != fact.bare and _specific(fact.bare):
                # `48.2s` is specific enough to be found by value and unit alone
                found.update(get("v" + fact.value, ()))
            unit = fact.value.partition(" ")[2]
            if not found and unit and unit not in _BASES and not unit.startswith("/"):
                # `<32hex>` is stated by `32 hex trace_id`: a word glued on, not a unit
                found.update(get("n" + fact.bare + "\0" + _stem(unit), ()))
            return frozenset(found)
        if fact.kind == "path":
            parts = _components(fact.value)[-_PATH_DEPTH:]
            found.update(get("p" + "/".join(parts), ()))
            if not found and fact.value[0].isalpha() and all(p.isalpha() for p in parts):
                # `process management (fork/clone/execve)`: plain words joined by slashes that
                # no source has as a path are alternatives, stated by one source naming each
                ids: set[str] | None = None
                for p in parts:
                    ids = (
                        set(get("w" + p.lower(), ()))
                        if ids is None
                        else ids & get("w" + p.lower(), set())
                    )
                found.update(ids or ())
            return frozenset(found)
        if fact.kind == "quote":
            # verbatim up to case, spacing and punctuation, in one source; quotes are few, so
            # looking through the sources' words (kept normalised) costs less than indexing them
            found.update(get("q:" + fact.value, ()))
            needle = " " + fact.value + " "
            candidates: set[str] | None = None
            for w in sorted(set(fact.value.split()), key=len, reverse=True)[:3]:
                ids = get("w" + w, set())
                candidates = ids if candidates is None else candidates & ids
            norm = self._norm
            found.update(s for s in candidates or () if s in norm and needle in norm[s])
            if not found:
                found.update(self._loosely_quoted(fact))
            return frozenset(found)
        found.update(get(fact.kind[0] + ":" + fact.value, ()))
        found.update(get("t" + fact.value, ()))
        return frozenset(found)

    def _loosely_quoted(self, fact: Fact) -> Iterator[str]:
        """Sources a quote is near-verbatim in: a long quote (8 words or more) with nine in ten
        of its word pairs in one source (the user typed "Review ,Deiscussion", the summary
        quotes "Review, Discussion"); a code span of a few words and no digits with its words
        in order within a dozen words of one source (`overallStatus: "degraded"` of
        `overallStatus = failed ? "degraded" : "ok"`)."""
        words = fact.value.split()
        longest = sorted(set(words), key=len, reverse=True)[:3]
        seen = Counter(s for w in longest for s in self._keys.get("w" + w, ()))
        candidates = [s for s, n in seen.items() if n >= min(2, len(longest)) and s in self._norm]
        if len(words) >= 8:
            pairs = [f" {a} {b} " for a, b in itertools.pairwise(words)]
            need = 0.9 * len(pairs)
            span = 3 * len(fact.value)
            anchors = [" " + w + " " for w in longest]
            for sid in candidates:
                norm = self._norm[sid]
                # only where the quote could be: around the first few places its longest words
                # are (a source may be 100 KB; the quote is a few hundred characters)
                for at in _places(norm, anchors, 5):
                    window = norm[max(0, at - span) : at + span]
                    if sum(p in window for p in pairs) >= need:
                        yield sid
                        break
        elif fact.text.startswith("`") and not any(c.isdigit() for c in fact.value):
            for sid in candidates:
                if _in_order(self._norm[sid], words, 12):
                    yield sid

    def assigned_facts(self, source_ids: Iterable[str]) -> Iterator[tuple[Fact, str]]:
        """The `key: value` numbers of these sources: the facts a summary should not drop."""
        for sid in source_ids:
            for fact in self._assigned.get(sid, ()):
                yield fact, sid


#: Words naming a duration: a unitless 1000 or more beside them is also read as milliseconds.
_TIME = frozenset(
    _stem(w)
    for w in [
        "timeout",
        "delay",
        "interval",
        "sleep",
        "wait",
        "ttl",
        "duration",
        "latency",
        "elapsed",
        "backoff",
    ]
)
#: The line-number gutter of a file read (`  1274→`): its last number is the file's line count.
#: Units a number's value is folded to (`_UNITS`); any other word glued to it is context.
_BASES = frozenset(base for base, _ in _UNITS.values() if base)
_GUTTER_RE = re.compile(r"^ *(\d+)\u2192", re.MULTILINE)
#: An enumeration marker, at a line start or inline after a sentence: `1.`, `2)`.
_ENUM_RE = re.compile(r"(?:^|(?<=[\s(]))(\d{1,2})[.)](?=\s)", re.MULTILINE)
_LINE = _stem("line")


def _counts(text: str) -> Iterator[Fact]:
    """Counts a source states by its shape, not in words: a file read whose gutter ends at 1274
    states "1274 lines"; a text enumerating `1.` to `4.` states that there are four of them,
    described by the words before the first marker and after each one."""
    gutter = _GUTTER_RE.findall(text)
    if gutter:
        yield Fact("number", str(int(gutter[-1])), frozenset((_LINE,)))
    yield from _bullets(text)
    run: list[re.Match[str]] = []
    for m in _ENUM_RE.finditer(text):
        n = int(m.group(1))
        if n == len(run) + 1:
            run.append(m)
            continue
        yield from _enumeration(text, run)
        run = [m] if n == 1 else []
    yield from _enumeration(text, run)


#: A bulleted line: its marker (`-`, `*`, `•`, `↳`, …) and the words after it.
_BULLET_RE = re.compile(r"^[ \t]*([-*+\u2022\u21b3\u2190\u25cb\u25cf>])[ \t]+(\S.*)$", re.MULTILINE)


def _bullets(text: str) -> Iterator[Fact]:
    """A run of lines with the same bullet states how many there are (`CHILDREN` followed by
    three `↳ …` lines: three subtasks), described by the words before and in the items."""
    run: list[re.Match[str]] = []
    for m in _BULLET_RE.finditer(text):
        if run and (
            m.group(1) != run[-1].group(1) or text.count("\n", run[-1].end(), m.start()) != 1
        ):
            yield from _enumeration(text, run)
            run = []
        run.append(m)
    yield from _enumeration(text, run)


def _enumeration(text: str, run: list[re.Match[str]]) -> Iterator[Fact]:
    if len(run) < 2:
        return
    words = [w for w, _ in _context(text[max(0, run[0].start() - 200) : run[0].start()])][-12:]
    for m in run:
        words += [w for w, _ in _context(text[m.end() : m.end() + 60])][:4]
    if words:
        yield Fact("number", str(len(run)), frozenset(words))


def _places(norm: str, needles: list[str], limit: int) -> Iterator[int]:
    """Up to `limit` positions of each needle in `norm`."""
    for needle in needles:
        at = norm.find(needle)
        for _ in range(limit):
            if at < 0:
                break
            yield at
            at = norm.find(needle, at + 1)


def _in_order(norm: str, words: list[str], within: int) -> bool:
    """Whether `words` occur in this order in `norm` (one space apart) within `within` words."""
    first = " " + words[0] + " "
    at = norm.find(first)
    tries = 0
    while at >= 0 and tries < 100:
        rest = norm[at + 1 :].split(" ", within + 1)[:within]
        i = 0
        for w in rest:
            if w == words[i]:
                i += 1
                if i == len(words):
                    return True
        at = norm.find(first, at + 1)
        tries += 1
    return False


def _specific(digits: str) -> bool:
    """Whether a number has at least three significant digits (`48.2`, `1500`, not `5`, `100`)."""
    return len(digits.replace(".", "").replace("-", "").strip("0")) >= 3


def _components(path: str) -> list[str]:
    return [p for p in path.split("/") if p not in ("", ".", "~")]


@dataclass(frozen=True)
class Grounding:
    """What a check found: each fact of the output and the sources it rests on.

    `grounded` facts have a live source; `unverifiable` ones are stated only by dead sources (or
    by an earlier summary whose sources are dead); `ungrounded` ones by nothing the guard knows;
    `dropped` are `key: value` facts (or pinned facts) of the live sources the output lost.
    """

    facts: tuple[Fact, ...]
    sources: Mapping[Fact, frozenset[str]]  # live source ids per grounded fact
    unverifiable: tuple[Fact, ...]
    ungrounded: tuple[Fact, ...]
    dropped: tuple[Fact, ...]
    key_facts: int  # how many key facts the sources had (the denominator of the dropped ratio)
    dead: Mapping[Fact, frozenset[str]] = field(default_factory=dict)

    @property
    def grounded(self) -> tuple[Fact, ...]:
        return tuple(f for f in self.facts if f in self.sources)

    def provenance(self) -> tuple[tuple[Fact, frozenset[str]], ...]:
        """Each fact with every source it rests on, live or dead, to record with the summary."""
        out = []
        for f in self.facts:
            ids = self.sources.get(f, frozenset()) | self.dead.get(f, frozenset())
            out.append((f, ids))
        return tuple(out)

    def counts(self) -> dict[str, int]:
        return dict(Counter(f.kind for f in self.facts))

    def summary(self) -> dict[str, Any]:
        """The `summary` activation: counts, kinds and ratios, never a fact's text."""
        n = len(self.facts)

        def kinds(facts: Iterable[Fact]) -> list[str]:
            seen = {f.kind for f in facts}
            return [k for k in KINDS if k in seen]

        def by_kind(facts: Iterable[Fact]) -> dict[str, int]:
            c = Counter(f.kind for f in facts)
            return {k: c[k] for k in KINDS}

        grounded = len(self.sources)
        return {
            "facts": n,
            "grounded": grounded,
            "ungrounded": len(self.ungrounded),
            "unverifiable": len(self.unverifiable),
            "dropped": len(self.dropped),
            "key_facts": self.key_facts,
            "kinds": kinds(self.facts),
            "ungrounded_kinds": kinds(self.ungrounded),
            "unverifiable_kinds": kinds(self.unverifiable),
            "dropped_kinds": kinds(self.dropped),
            "counts": by_kind(self.facts),
            "ungrounded_counts": by_kind(self.ungrounded),
            "unverifiable_counts": by_kind(self.unverifiable),
            "dropped_counts": by_kind(self.dropped),
            "grounded_ratio": grounded / n if n else 1.0,
            "ungrounded_ratio": len(self.ungrounded) / n if n else 0.0,
            "dropped_ratio": len(self.dropped) / self.key_facts if self.key_facts else 0.0,
        }

    def describe(self, limit: int = 5) -> str:
        """The ungrounded, unverifiable and dropped facts as one line, for an error message."""
        parts = []
        for label, facts in (
            ("ungrounded", self.ungrounded),
            ("unverifiable", self.unverifiable),
            ("dropped", self.dropped),
        ):
            if facts:
                shown = "; ".join(f"{f.kind} {str(f)!r}" for f in facts[:limit])
                more = f" (+{len(facts) - limit} more)" if len(facts) > limit else ""
                parts.append(f"{label}: {shown}{more}")
        return ", ".join(parts) or "every fact grounded"


#: An optional heavier checker: how strongly `premise` (a passage of a source) supports
#: `hypothesis` (a sentence of the summary), from 0 to 1. An NLI or factual-consistency model
#: (`nli_judge`), or any callable.
Judge = Callable[[str, str], float]


def check(
    output: str,
    index: FactIndex,
    live: Collection[str] | None = None,
    *,
    carried: FactIndex | None = None,
    pinned: Iterable[str] = (),
    judge: Judge | None = None,
    threshold: float = 0.5,
    scope: Collection[str] | None = None,
) -> Grounding:
    """Map every fact of `output` to the live sources of `index` that state it.

    `live`: the source ids the store can still give back (None: every indexed source).
    `scope`: the only ids that may state a fact at all, live or dead (the sources the input
    rests on); a fact that only other indexed sources state is ungrounded, not unverifiable, so
    what a shared index happens to hold from other calls changes no finding. None: every id.
    `carried`: the recorded provenance of the summaries in the input; a fact of the output that
    only an earlier summary stated inherits that summary's sources for it.
    `pinned`: texts whose facts the output must keep (reported as dropped when it does not).
    `judge`: an optional heavier checker run behind the deterministic one: each sentence of the
    output is put to it against the passages of the live sources that share its words, and a
    sentence no passage supports to `threshold` is reported as an ungrounded `claim`. It only
    adds findings: nothing the deterministic check refuses is let through by a model.
    """
    if not isinstance(output, str):
        msg = f"output must be str, got {type(output).__name__}"
        raise TypeError(msg)
    facts = extract(output)
    with index._lock:
        found = _check(facts, index, live, carried, pinned, scope)
        if judge is None:
            return found
        claims = tuple(_unsupported(output, index, live, judge, threshold))
    if not claims:
        return found
    return replace(
        found,
        facts=tuple(sorted((*found.facts, *claims), key=lambda f: f.start)),
        ungrounded=found.ungrounded + claims,
    )


_SENTENCE_RE = re.compile(r"[^.!?\n]+(?:[.!?]+|$)", re.MULTILINE)
#: Passages put to a judge: at most this many per sentence, this many characters each.
_PASSAGES = 3
_PASSAGE_CHARS = 600


def _unsupported(
    output: str, index: FactIndex, live: Collection[str] | None, judge: Judge, threshold: float
) -> Iterator[Fact]:
    """The sentences of `output` no live passage supports, as `claim` facts."""
    live_ids = index._norm.keys() if live is None else set(live) & index._norm.keys()
    for m in _SENTENCE_RE.finditer(output):
        sentence = m.group().strip()
        words = [w for w in _WORDS_RE.findall(sentence.lower()) if w not in _STOP and len(w) > 2]
        if len(words) < 3:
            continue  # a heading or a fragment: nothing to judge
        shared = Counter(
            s for w in set(words) for s in index._keys.get("w" + w, ()) if s in live_ids
        )
        best = 0.0
        for sid, _ in shared.most_common(_PASSAGES):
            best = max(best, float(judge(_passage(index._norm[sid], words), sentence)))
            if best >= threshold:
                break
        if best < threshold:
            start = m.start() + m.group().find(sentence)
            value = " ".join(_WORDS_RE.findall(sentence.lower()))
            yield Fact("claim", value, text=sentence, start=start, end=start + len(sentence))


def _passage(norm: str, words: list[str]) -> str:
    """The part of a source (its words, lowercased) around the first of `words` it has."""
    at = min((i for i in (norm.find(" " + w + " ") for w in words) if i >= 0), default=0)
    lo = max(0, at - _PASSAGE_CHARS // 3)
    return norm[lo : lo + _PASSAGE_CHARS].strip()


class CheckerUnavailable(RuntimeError):
    """The optional heavier checker cannot run here: its extra or its model is missing."""


def nli_judge(
    model: str = "cross-encoder/nli-deberta-v3-xsmall", *, local_files_only: bool = True
) -> Judge:
    """A `Judge` from a Hugging Face NLI model (the `nli` extra: `pip install 'policyhook[nli]'`):
    the probability that the passage entails the sentence.

    The model is loaded from the local cache only (`local_files_only=True`): policyhook never
    downloads weights while it guards a call. Fetch them once beforehand (`huggingface-cli
    download <model>`). CheckerUnavailable, saying which, when the extra is not installed or the
    model is not in the cache.
    """
    try:
        import torch  # type: ignore[import-not-found, unused-ignore]
        import transformers  # type: ignore[import-not-found, unused-ignore]
    except ImportError as exc:
        msg = (
            f"the NLI checker needs the nli extra ({exc.name} is not installed): "
            "pip install 'policyhook[nli]'"
        )
        raise CheckerUnavailable(msg) from None
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            model, local_files_only=local_files_only
        )
        network = transformers.AutoModelForSequenceClassification.from_pretrained(
            model, local_files_only=local_files_only
        )
    except (OSError, ValueError) as exc:
        msg = (
            f"NLI model {model!r} is not available offline ({exc}); download it once with "
            f"`huggingface-cli download {model}`, or pass local_files_only=False"
        )
        raise CheckerUnavailable(msg) from None
    labels = {str(k).lower(): int(v) for k, v in network.config.label2id.items()}
    if "entailment" not in labels:
        msg = f"NLI model {model!r} has no entailment label: {sorted(labels)}"
        raise CheckerUnavailable(msg)
    entail = labels["entailment"]
    network.eval()

    def judge(premise: str, hypothesis: str) -> float:
        batch = tokenizer(premise, hypothesis, truncation=True, return_tensors="pt")
        with torch.no_grad():
            logits = network(**batch).logits[0]
        return float(torch.softmax(logits, dim=-1)[entail])

    return judge


def _check(
    facts: tuple[Fact, ...],
    index: FactIndex,
    live: Collection[str] | None,
    carried: FactIndex | None,
    pinned: Iterable[str],
    scope: Collection[str] | None = None,
) -> Grounding:
    live_set = None if live is None else live if isinstance(live, (set, frozenset)) else set(live)
    in_scope = None if scope is None else frozenset(scope)
    sources: dict[Fact, frozenset[str]] = {}
    dead: dict[Fact, frozenset[str]] = {}
    unverifiable: list[Fact] = []
    ungrounded: list[Fact] = []
    for fact in facts:
        ids = index.sources_of(fact)
        if carried is not None:
            ids = ids | carried.sources_of(fact)
        if in_scope is not None:
            ids = ids & in_scope
        alive = ids if live_set is None else ids & live_set
        if alive:
            sources[fact] = alive
        elif ids:
            dead[fact] = ids
            unverifiable.append(fact)
        else:
            ungrounded.append(fact)
    live_ids = index._owned.keys() if live_set is None else live_set
    assigned = index._assigned
    key_facts = [f for sid in live_ids for f in assigned.get(sid, ())]
    for text in pinned:
        key_facts.extend(extract(text))
    kept = _Carried(facts)
    values, bares, contains = kept.numbers, kept.bares, kept.__contains__
    dropped = tuple(
        dict.fromkeys(
            [
                f
                for f in key_facts
                # a number whose value the output never states is dropped without a lookup
                if (f.kind == "number" and f.value not in values and f.bare not in bares)
                or not contains(f)
            ]
        )
    )
    return Grounding(
        facts=facts,
        sources=sources,
        unverifiable=tuple(unverifiable),
        ungrounded=tuple(ungrounded),
        dropped=dropped,
        key_facts=len(key_facts),
        dead=dead,
    )


class _Carried:
    """The facts of an output, looked up by value: which key facts of the sources it kept."""

    def __init__(self, facts: Iterable[Fact]) -> None:
        self.numbers: dict[str, set[str]] = {}  # context words by value
        self.bares: dict[str, set[str]] = {}  # and by the number as written
        self.values: set[tuple[str, str]] = set()
        self.hashes: list[str] = []
        for f in facts:
            if f.kind == "number":
                self.numbers.setdefault(f.value, set()).update(f.context)
                if f.bare != f.value or f.context:
                    self.bares.setdefault(f.bare, set()).update(f.context)
            elif f.kind == "path":
                parts = _components(f.value)
                self.values.update(("path", "/".join(parts[i:])) for i in range(len(parts)))
            elif f.kind == "hash":
                self.hashes.append(f.value)
            else:
                self.values.add((f.kind, f.value))

    def __contains__(self, fact: Fact) -> bool:
        if fact.kind == "number":
            by_value = self.numbers.get(fact.value)
            by_bare = self.bares.get(fact.bare)
            if by_value is None and by_bare is None:
                return False
            words = (by_value or set()) | (by_bare or set())
            if by_value is not None and not (fact.context and words):
                return True  # a number with a unit and no words: kept by value and unit
            return not words.isdisjoint(fact.context)
        if fact.kind == "hash":
            return any(fact.value.startswith(h) or h.startswith(fact.value) for h in self.hashes)
        if fact.kind == "path":
            return ("path", "/".join(_components(fact.value))) in self.values
        return (fact.kind, fact.value) in self.values


def cite(output: str, grounding: Grounding, limit: int = 3) -> str:
    """`output` with the live sources of each grounded fact after it: `ceiling 7 [cfg-42]`."""
    marks: dict[int, list[str]] = {}
    for fact in grounding.facts:
        ids = grounding.sources.get(fact)
        if not ids:
            continue
        shown = sorted(ids)[:limit]
        refs = ", ".join(shown) + (f", +{len(ids) - limit}" if len(ids) > limit else "")
        if fact.end and output[fact.start : fact.end] == fact.text:
            marks.setdefault(fact.end, []).append(refs)
    pieces = []
    last = 0
    for end in sorted(marks):
        pieces.append(output[last:end])
        pieces.append(" [" + "; ".join(dict.fromkeys(marks[end])) + "]")
        last = end
    pieces.append(output[last:])
    return "".join(pieces)


# -- per-fact provenance as stores keep it (Store.put_summary(facts=...), Store.facts) ----------
# The guard records each granted summary's fact provenance in its store, so every process sharing
# the store carries it; these two functions are the only place facts are turned into what a store
# keeps and back.


def fact_records(
    grounding: Grounding, start: int = 0, end: int | None = None
) -> list[tuple[str, tuple[str, ...]]]:
    """The provenance of the facts written at [start, end) of the checked output, as a store
    records it: each fact as a string, with every source stating it (live or dead). A fact no
    source states is left out: there is nothing to carry."""
    out = []
    for fact, ids in grounding.provenance():
        if ids and start <= fact.start and (end is None or fact.start < end):
            key = json.dumps([fact.kind, fact.value, sorted(fact.context), fact.key, fact.bare])
            out.append((key, tuple(sorted(ids))))
    return out


def carried(records: Iterable[tuple[str, Collection[str]]]) -> FactIndex:
    """The facts earlier summaries were recorded with (`fact_records`), indexed for
    `check(carried=...)`; ValueError for a record that is not one."""
    facts = []
    for key, ids in records:
        try:
            kind, value, context, said, bare = json.loads(key)
            fact = Fact(str(kind), str(value), frozenset(map(str, context)), str(said))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"not a recorded fact: {key[:80]!r}") from exc
        fact.bare = str(bare)
        facts.append((fact, ids))
    index = FactIndex()
    index.add_facts(facts)
    return index
