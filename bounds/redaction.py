"""Secrets kept out of every text the project prints: one function, ``redact``.

Every error of the project is redacted when it is made (``errors.RowtimeError``), and so
are the labels of its metrics, ``rowtime describe``, the connectors' lines and the
``pyspark_rowtime`` logger's records: a message built from a location, or from a library's
error text that echoes one, cannot carry a secret out, whoever formatted it.

What ``redact`` replaces by ``***``:

1. the password of a URL, ``scheme://user:PASSWORD@host/...``: everything from the ``:`` after
   the user to the last ``@`` before the host, so a password written unencoded may hold
   ``/ @ : ? # %``, spaces and any other character and is still hidden whole (the text ends
   the search at the next URL that follows a space or a quote);
2. the value of a query parameter or ``key=value`` pair whose key names a secret
   (``names_a_secret``: ``sig``, ``X-Amz-Signature``, ``X-Amz-Security-Token``,
   ``AccountKey``, ``SharedAccessSignature``, ``token``, ``password``, ...; in a query
   ``key`` too), up to the next ``& ; #``, space or ``"`` (a ``'`` may be part of a query);
3. every secret the process was handed (``remember_secret``: a Redis password parsed from
   a location or read from its ``password_env``) and the value of every environment variable
   whose name names a secret (``AWS_SECRET_ACCESS_KEY``, ``AZURE_STORAGE_SAS_TOKEN``, ...), as
   written and in their percent-encoded and escaped forms, wherever they appear: a library's
   message that quotes a piece of a URL without its ``scheme://`` is caught here.

A secret shorter than ``MIN_REMEMBERED`` characters is hidden by the first two rules only
(masking every ``abc`` of a text would hide more than it protects).

``split_userinfo`` is the one reading of where a location's credentials end; the
location parsers use it, so they and ``redact`` agree on what the password is.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import urllib.parse
from collections import OrderedDict

__all__ = [
    "MASK",
    "MIN_REMEMBERED",
    "holds_secret",
    "names_a_secret",
    "redact",
    "remember_secret",
    "split_userinfo",
]

MASK = "***"
#: Secrets remembered or read from the environment are masked from this length on.
MIN_REMEMBERED = 4
#: How many remembered secrets a process keeps (the oldest are forgotten first).
_REMEMBERED_MAX = 64

#: A URL scheme and its ``://``, not inside a longer word.
_SCHEME = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://")
#: A URL that starts a new word (after a space, a quote, a bracket, ``=`` or ``,``): where the
#: search for the end of an earlier URL's password stops.
_NEXT_URL = re.compile(r"(?<=[\s'\"(\[{<,=])[A-Za-z][A-Za-z0-9+.-]*://")
#: The user of a userinfo in a text: what may precede its ``:`` (a space ends a URL in a text).
_USER = re.compile(r"[^/?#@:\s]*")
#: The user of a location's userinfo without a password (RFC 3986: before the first / ? #).
_AUTHORITY_USER = re.compile(r"[^/?#@]*")

#: Words that make a key name a secret, and word pairs (joined with ``_``) that do.
_SECRET_WORDS = frozenset(
    "password passwd passphrase pwd pw pass secret secrets token tokens sig signature "
    "credential credentials sas apikey authorization".split()
)
_SECRET_PAIRS = (
    "access_key",
    "account_key",
    "shared_key",
    "shared_access_key",
    "private_key",
    "api_key",
    "secret_key",
    "master_key",
    "storage_key",
    "signing_key",
    "encryption_key",
    "client_secret",
    "connection_string",
    "conn_str",
    "security_token",
    "session_token",
)
#: Key suffixes that name where a secret is kept (``password_env``) or who it belongs to
#: (``AWS_ACCESS_KEY_ID``, an identifier AWS shows in its own errors), not the secret.
_NOT_SECRET_SUFFIXES = ("_env", "_file", "_path", "_var", "_id", "_name")

#: ``key=value`` after the start, a space, a quote, ``? & ;`` or a bracket.
_PAIR = re.compile(
    r"(?P<pre>(?:^|(?<=[\s?&;,(\[{'\"])))(?P<key>[A-Za-z][\w.-]{0,79})(?P<eq>=)"
    r"(?P<value>\"[^\"]*\"|'[^']*'|[^&;#\s\"]*)"
)


def _words(name: str) -> list[str]:
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name)
    return [w for w in re.split(r"[^A-Za-z0-9]+", snake.lower()) if w]


def names_a_secret(name: str) -> bool:
    """Whether a key (a query parameter, a catalog key, an environment variable) names a
    secret: ``password``, ``aws_secret_access_key``, ``AccountKey``, ``sas_token``,
    ``X-Amz-Signature``, ``connection_string``, ``api_key``, ... A key naming where a secret is
    kept or whose it is (``password_env``, ``*_file``, ``*_id``) does not."""
    words = _words(name)
    if not words:
        return False
    joined = "_".join(words)
    if joined.endswith(_NOT_SECRET_SUFFIXES):
        return False
    if _SECRET_WORDS.intersection(words):
        return True
    wrapped = f"_{joined}_"
    return any(f"_{pair}_" in wrapped for pair in _SECRET_PAIRS)


def split_userinfo(location: str) -> tuple[str, str | None, str | None, str]:
    """``location`` as ``(scheme://, user, password, rest)``, user and password as written
    (still percent-encoded) or None; ``rest`` is the host and all that follows.

    The userinfo ends at the last ``@`` of the location; when it holds a ``:``, the user is
    what comes before the first one and the password all that follows, so a password (or a
    user) written unencoded may hold any character. A userinfo without ``:`` is a user only
    where RFC 3986 reads one (before the first ``/ ? #``: ``abfs://container@account...``,
    while the ``@`` of ``s3://bucket/a@b`` is the prefix's). A location that is not a URL is
    ``("", None, None, location)``; nor has one whose ``scheme://`` is followed by ``/``
    (``file:///path``) a userinfo."""
    m = _SCHEME.match(location)
    if m is None:
        return "", None, None, location
    head, body = m.group(0), location[m.end() :]
    if body.startswith("/"):
        return head, None, None, body
    k = body.rfind("@")
    if k >= 0:
        colon = body.find(":", 0, k)
        if colon >= 0:
            return head, body[:colon], body[colon + 1 : k], body[k + 1 :]
    user = _AUTHORITY_USER.match(body)
    j = user.end() if user else 0
    if body[j : j + 1] == "@":
        return head, body[:j], None, body[j + 1 :]
    return head, None, None, body


def _hide_url_passwords(text: str) -> str:
    out: list[str] = []
    pos = 0
    while True:
        m = _SCHEME.search(text, pos)
        if m is None:
            break
        start = m.end()
        user = _USER.match(text, start)
        j = user.end() if user else start
        if text[j : j + 1] != ":":
            out.append(text[pos:start])
            pos = start
            continue
        nxt = _NEXT_URL.search(text, j + 1)
        limit = nxt.start() if nxt else len(text)
        k = text.rfind("@", j + 1, limit)
        if k < 0:
            out.append(text[pos : j + 1])
            pos = j + 1
            continue
        out.append(text[pos : j + 1] + MASK)
        pos = k  # the "@" and the host stay
    out.append(text[pos:])
    return "".join(out)


def _hide_pair(m: re.Match[str]) -> str:
    key = m.group("key")
    # A bare "key" is an API key in a query or a connection string (?key=, ;Key=), a word
    # anywhere else.
    query_key = key.lower() == "key" and m.start() > 0 and m.string[m.start() - 1] in "?&;"
    value = m.group("value")
    if value in ("", MASK):
        return m.group(0)
    if not (query_key or names_a_secret(key)):
        # The value may hold a pair of its own: "?a=1?sig=..." (a raw "?" in a query).
        inner = _PAIR.sub(_hide_pair, value) if "=" in value else value
        return f"{m.group('pre')}{key}{m.group('eq')}{inner}"
    return f"{m.group('pre')}{key}{m.group('eq')}{MASK}"


#: Remembered secrets (insertion order: the oldest is forgotten first), each with its forms.
_REMEMBERED: OrderedDict[str, tuple[str, ...]] = OrderedDict()
_LOCK = threading.Lock()
_ENV_SCAN: tuple[int, float, list[str]] | None = None
#: The forms of every secret to mask now, longest first (None: to be built again).
_ALL_FORMS: tuple[tuple[str, ...], tuple[str, ...]] | None = None
_ENV_FORMS: dict[str, tuple[str, ...]] = {}


def remember_secret(value: str | None) -> None:
    """Mask ``value`` (and its encoded forms) in every text ``redact`` sees from now on
    in this process. Parsers call it with the passwords they find, before anything can fail."""
    global _ALL_FORMS
    if not value or len(value) < MIN_REMEMBERED:
        return
    with _LOCK:
        if value in _REMEMBERED:
            _REMEMBERED.move_to_end(value)
            return
        _REMEMBERED[value] = _forms(value)
        while len(_REMEMBERED) > _REMEMBERED_MAX:
            _REMEMBERED.popitem(last=False)
        _ALL_FORMS = None


def _environment_secrets() -> list[str]:
    """The values of the environment variables that name secrets. Which variables those are
    is looked up again when the environment's size changes, and at least every second
    (decoding every variable costs more than a redaction); their values are read each time."""
    global _ENV_SCAN
    now = time.monotonic()
    size = len(os.environ)
    if _ENV_SCAN is None or _ENV_SCAN[0] != size or now - _ENV_SCAN[1] > 1.0:
        _ENV_SCAN = (size, now, [n for n in os.environ if names_a_secret(n)])
    out = []
    for name in _ENV_SCAN[2]:
        value = os.environ.get(name)
        if value is not None and len(value) >= MIN_REMEMBERED:
            out.append(value)
    return out


def _forms(secret: str) -> tuple[str, ...]:
    """The ways a text may spell ``secret``: as is, decoded, percent-encoded (every safe set a
    URL library uses, either case of the hex digits), as ``repr`` and JSON write it inside
    quotes."""
    forms = {secret, urllib.parse.unquote(secret)}
    for s in list(forms):
        for safe in ("", "/", "!$&'()*+,;=:@/"):
            encoded = urllib.parse.quote(s, safe=safe)
            forms |= {encoded, re.sub(r"%[0-9A-F]{2}", lambda h: h.group(0).lower(), encoded)}
        forms.add(urllib.parse.quote_plus(s, safe=""))
        forms.add(repr(s)[1:-1])
        forms.add(json.dumps(s)[1:-1])
        forms.add(s.encode("unicode_escape").decode("ascii"))
    return tuple(f for f in forms if len(f) >= MIN_REMEMBERED)


def _masked_forms() -> tuple[str, ...]:
    """Every form of every secret to mask now, longest first."""
    global _ALL_FORMS
    env = tuple(_environment_secrets())
    with _LOCK:
        if _ALL_FORMS is None or _ALL_FORMS[0] != env:
            forms: set[str] = set()
            for value in env:
                if value not in _ENV_FORMS:
                    if len(_ENV_FORMS) > 256:
                        _ENV_FORMS.clear()
                    _ENV_FORMS[value] = _forms(value)
                forms.update(_ENV_FORMS[value])
            for remembered in _REMEMBERED.values():
                forms.update(remembered)
            _ALL_FORMS = (env, tuple(sorted(forms, key=len, reverse=True)))
        return _ALL_FORMS[1]


def holds_secret(text: str) -> bool:
    """Whether ``text`` holds a URL password or a ``key=value`` whose key names a secret
    (rules 1 and 2 of ``redact``; not what the process remembers)."""
    hidden = _hide_url_passwords(text) if "://" in text else text
    return hidden != text or ("=" in text and _PAIR.sub(_hide_pair, text) != text)


def redact(text: str) -> str:
    """``text`` with every secret it holds replaced by ``***`` (the module docstring says which
    are). Idempotent; a text without a secret comes back unchanged."""
    if not isinstance(text, str):
        text = str(text)
    for form in _masked_forms():
        if form in text:
            text = text.replace(form, MASK)
    if "://" in text:
        text = _hide_url_passwords(text)
    if "=" in text:
        text = _PAIR.sub(_hide_pair, text)
    return text


class _RedactingFilter(logging.Filter):
    """Redacts each record of the logger it sits on (its message with the arguments in)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        hidden = redact(message)
        if hidden != message:
            record.msg, record.args = hidden, ()
        return True


#: The project's logger, its records redacted (every module logs to this one by name).
LOGGER = logging.getLogger("pyspark_rowtime")
if not any(isinstance(f, _RedactingFilter) for f in LOGGER.filters):
    LOGGER.addFilter(_RedactingFilter())
