"""No secret in any output (issue 55, item 3): passwords, tokens, keys and signatures written
into locations, or held in the environment, never appear in errors, tracebacks, ``describe``,
metrics labels, logs or refusals, in whole or in part, whatever characters they hold; a
catalog key that names a secret is refused without its value.

Every generated secret carries a marker character (``MARKERS``) at every third place, and no
text of the project holds one: any four characters of a secret hold a marker, so a marker in
an output (as written, escaped or percent-encoded) is a piece of the secret that got out."""

from __future__ import annotations

import json
import logging
import re
import socket
import traceback
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pyspark_rowtime.api import create_stream
from pyspark_rowtime.bounds.errors import OptionError, RowtimeError
from pyspark_rowtime.bounds.redaction import (
    holds_secret,
    names_a_secret,
    redact,
    remember_secret,
    split_userinfo,
)
from pyspark_rowtime.cli import main
from pyspark_rowtime.metrics import exposition, stream_label
from pyspark_rowtime.sink.options import parse_sink_options
from pyspark_rowtime.streams.catalog import CatalogError, load_catalog
from pyspark_rowtime.streams.redis.location import parse_location
from pyspark_rowtime.streams.storage import open_stream, what_is_at

MARKERS = "¤§¶"
#: Characters that break naive URL parsing and redaction, drawn often.
TRICKY = "/@:%#?&=;'\"\\ \t\n+~[]é密😀"
_CHUNK_CHAR = st.one_of(
    st.sampled_from(TRICKY),
    st.characters(blacklist_categories=("Cs",), blacklist_characters=MARKERS),
)


@st.composite
def secrets(draw: Any, chars: Any = _CHUNK_CHAR) -> str:
    """A secret of 4 to 24 characters, any of them, a marker at every third place."""
    chunks = draw(st.lists(st.text(chars, max_size=2), min_size=4, max_size=8))
    marks = draw(st.lists(st.sampled_from(MARKERS), min_size=len(chunks), max_size=len(chunks)))
    return "".join(m + c for m, c in zip(marks, chunks, strict=True))


#: Characters a query value can hold as written (no & # or space).
_QUERY_CHAR = st.sampled_from("abcXYZ019%+/=-_.~:@!$'()*,")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once it is closed


def leaked(secret: str, text: str) -> list[str]:
    """The pieces of ``secret`` found in ``text``: any 4 characters in a row, the marker
    characters as written, escaped (repr, JSON) or percent-encoded."""
    found = [secret[i : i + 4] for i in range(len(secret) - 3) if secret[i : i + 4] in text]
    for m in MARKERS:
        encoded = urllib.parse.quote(m)
        forms = (m, m.encode("unicode_escape").decode(), json.dumps(m)[1:-1], encoded)
        found += [f for f in forms if f in text or ("%" in f and f.lower() in text.lower())]
    for form in (urllib.parse.quote(secret, safe=""), urllib.parse.quote_plus(secret)):
        if form in text:
            found.append(form)
    return found


def error_text(fn: Callable[[], Any]) -> str:
    """What a failure of ``fn`` shows: its message and its whole traceback ("" if it passed)."""
    try:
        fn()
    except Exception as e:
        return str(e) + "\n" + "".join(traceback.format_exception(e))
    return ""


def url_with(scheme: str, secret: str, encode: bool, port: int, folder: Path) -> str:
    pw = urllib.parse.quote(secret, safe="") if encode else secret
    if scheme in ("redis", "rediss"):
        return f"{scheme}://ops:{pw}@127.0.0.1:{port}/0/orders?retries=0&connect_timeout=200ms"
    if scheme in ("abfs", "abfss"):
        return f"{scheme}://box:{pw}@acct.dfs.core.windows.net/orders"
    if scheme == "file":
        return f"file://ops:{pw}@host{folder}/orders"
    return f"{scheme}://ops:{pw}@bucket/orders"


SCHEMES = ["redis", "rediss", "s3", "s3a", "az", "azure", "abfs", "abfss", "file", "ftp"]


# -- the redaction itself ----------------------------------------------------------------------


@given(
    scheme=st.sampled_from([*SCHEMES, "https", "postgresql"]),
    secret=secrets(),
    user=st.text("abcops_-.%2F'", max_size=6),
    quote=st.sampled_from(["", "'", '"']),
)
def test_a_url_password_of_any_characters_is_hidden_whole_in_any_text(
    scheme: str, secret: str, user: str, quote: str
) -> None:
    url = f"{scheme}://{user}:{secret}@host.example:6379/0/orders"
    text = f"stream {quote}{url}{quote} failed: boom; see {quote}s3://b/p{quote}"
    shown = redact(text)
    assert leaked(secret, shown) == [], shown
    assert f"{scheme}://{user}:***@host.example:6379/0/orders" in shown
    assert shown.endswith(f"see {quote}s3://b/p{quote}")  # what follows is kept
    assert redact(shown) == shown  # idempotent
    assert split_userinfo(url) == (f"{scheme}://", user, secret, "host.example:6379/0/orders")


@given(
    name=st.sampled_from(
        [
            "sig",
            "X-Amz-Signature",
            "X-Amz-Security-Token",
            "X-Amz-Credential",
            "token",
            "access_token",
            "AccountKey",
            "SharedAccessSignature",
            "password",
            "client_secret",
            "sas_token",
            "key",
        ]
    ),
    value=st.text(_QUERY_CHAR, min_size=1, max_size=8).map(lambda v: "¤" + v + "§"),
    sep=st.sampled_from(["?", "&", ";"]),
)
def test_a_secret_query_parameter_or_connection_string_value_is_hidden(
    name: str, value: str, sep: str
) -> None:
    text = (
        f"GET https://acct.blob.core.windows.net/c/k?sv=2022-11-02{sep}{name}={value}&se=1 failed"
    )
    if sep == ";":
        text = f"DefaultEndpointsProtocol=https;AccountName=acct;{name}={value};EndpointSuffix=x"
    shown = redact(text)
    assert leaked(value, shown) == [], shown
    assert f"{name}=***" in shown
    assert "sv=2022-11-02" in shown or "AccountName=acct" in shown  # the rest stays readable


def test_what_is_not_a_secret_is_left_as_it_is() -> None:
    for text in (
        "redis://h:6379/0/s and /data/x",
        "redis://ops@h:6379/0/s?password_env=REDIS_PASSWORD&retries=3",
        "abfs://box@acct.dfs.core.windows.net/orders",
        "--default 'order' is not key=value",
        "s3://bucket/orders?sv=2022-11-02",
        "option partitions=3",
    ):
        assert redact(text) == text
    assert not holds_secret("redis://h:6379/0/s?password_env=X")
    assert holds_secret("redis://:pw@h/0/s") and holds_secret("s3://b/p?X-Amz-Signature=ab")


@pytest.mark.parametrize(
    "name, secret",
    [
        ("aws_secret_access_key", True),
        ("AWS_SESSION_TOKEN", True),
        ("connection_string", True),
        ("AccountKey", True),
        ("account_key", True),
        ("sas_token", True),
        ("client_secret", True),
        ("password", True),
        ("token", True),
        ("X-Amz-Signature", True),
        ("password_env", False),
        ("AWS_ACCESS_KEY_ID", False),
        ("AWS_SHARED_CREDENTIALS_FILE", False),
        ("location", False),
        ("partitions", False),
        ("rowtime_column", False),
        ("sv", False),
    ],
)
def test_which_names_name_a_secret(name: str, secret: bool) -> None:
    assert names_a_secret(name) is secret


@given(secret=secrets())
def test_a_remembered_secret_is_hidden_wherever_a_library_quotes_a_piece_of_a_url(
    secret: str,
) -> None:
    remember_secret(secret)
    for text in (
        f"Port could not be cast to integer value as {secret!r}",
        f"no such host {urllib.parse.quote(secret, safe='')}",
        json.dumps({"where": secret}),
    ):
        assert leaked(secret, redact(text)) == [], redact(text)


def test_environment_secrets_are_hidden_in_every_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "¤aws/secret+key§")
    monkeypatch.setenv("AZURE_STORAGE_SAS_TOKEN", "sv=2022&sig=¤sig%2Fnature§")
    error = OptionError("request to http://127.0.0.1/b?key=x signed with ¤aws/secret+key§")
    assert "¤" not in str(error) and "***" in str(error)
    assert "¤" not in redact("sent sv=2022&sig=¤sig%2Fnature§ to the store")


# -- every output surface, every scheme ---------------------------------------------------------


def catalog_with(tmp_path: Path, location: str) -> str:
    def toml(s: str) -> str:
        escaped = "".join(
            f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F or c in '"\\' else c for c in s
        )
        return f'"{escaped}"'

    path = tmp_path / "catalog.toml"
    path.write_text(f'[streams.orders]\nlocation = {toml(location)}\nschema = "a INT"\n')
    return str(path)


@settings(
    deadline=None,
    max_examples=150,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(scheme=st.sampled_from(SCHEMES), secret=secrets(), encode=st.booleans())
def test_no_output_shows_a_piece_of_a_password_in_a_location(
    scheme: str,
    secret: str,
    encode: bool,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = url_with(scheme, secret, encode, closed_port(), tmp_path)
    texts = {
        "what_is_at": error_text(lambda: what_is_at(url)),
        "open": error_text(lambda: open_stream(url)),
        "create": error_text(lambda: create_stream(url, "a INT")),
        "create 10001": error_text(lambda: create_stream(url, "a INT", 10_001)),
        "sink": error_text(lambda: parse_sink_options({"path": url}, _sink_schema())),
        "checkpoint": error_text(
            lambda: parse_sink_options(
                {"path": str(tmp_path / "t"), "checkpointLocation": url}, _sink_schema()
            )
        ),
        "catalog": error_text(lambda: load_catalog(catalog_with(tmp_path, url))),
        "metrics label": stream_label(url),
    }
    if scheme in ("redis", "rediss"):
        texts["parse"] = error_text(lambda: parse_location(url))
    for command in (["describe", url], ["describe", "--json", url], ["metrics", url]):
        code = main(command)
        out, err = capsys.readouterr()
        texts[" ".join(command[:-1])] = out + err
        assert code == 2 and err.count("\n") == 1, err  # refused, in one line
    logging.getLogger("pyspark_rowtime").warning("retention of %s not applied", url)
    texts["log"] = "\n".join(r.getMessage() for r in caplog.records)
    caplog.clear()
    for surface, text in texts.items():
        assert leaked(secret, text) == [], (surface, text)
    assert not (tmp_path / "orders").exists(), "a refused location stored something"


def _sink_schema() -> Any:
    import pyarrow as pa

    return pa.schema([("rowtime", pa.timestamp("us", tz="UTC")), ("is_bound", pa.bool_())])


@settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(
    scheme=st.sampled_from(["s3", "az", "azure", "abfs"]),
    signature=st.text(_QUERY_CHAR, min_size=2, max_size=10).map(lambda v: "¤" + v + "§"),
    name=st.sampled_from(["sig", "X-Amz-Signature", "X-Amz-Security-Token", "token"]),
)
def test_a_token_in_an_object_storage_query_is_refused_without_being_shown(
    scheme: str, signature: str, name: str
) -> None:
    host = "box@acct.dfs.core.windows.net" if scheme == "abfs" else "bucket"
    url = f"{scheme}://{host}/orders?sv=2022-11-02&{name}={signature}&se=2030"
    for text in (error_text(lambda: open_stream(url)), error_text(lambda: what_is_at(url))):
        # A signature holding ":" and "@" reads as credentials: refused too, unshown either way.
        assert "has a query" in text or "carries credentials (not shown)" in text, text
        assert leaked(signature, text) == [], text
        assert "sv=2022" not in text  # the query is not shown at all


# -- a real Redis server: accepted whole, or refused with nothing stored ----------------------


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from redis_server import redis_server

    with redis_server(tmp_path_factory.mktemp("redis-secrets"), password="¤default§pw") as srv:
        yield srv


@settings(
    deadline=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(secret=secrets(), encode=st.booleans(), n=st.integers(0, 10**9))
def test_a_redis_password_of_any_characters_is_accepted_whole_or_refused_and_never_shown(
    acl_redis: Any, secret: str, encode: bool, n: int, capsys: pytest.CaptureFixture[str]
) -> None:
    admin = acl_redis.client()
    admin.execute_command("ACL", "SETUSER", "rt", "reset", "on", f">{secret}", "~*", "&*", "+@all")
    pw = urllib.parse.quote(secret, safe="") if encode else secret
    url = f"redis://rt:{pw}@127.0.0.1:{acl_redis.port}/0/s{n}?retries=0&connect_timeout=1s"
    keys_before = admin.dbsize()
    try:
        loc = parse_location(url)
    except OptionError as e:
        event("refused when parsed")
        assert not encode, f"a percent-encoded password is always read: {e}"
        assert "\n" not in str(e) and leaked(secret, str(e)) == []
        assert admin.dbsize() == keys_before  # nothing stored
        return
    assert loc.password == urllib.parse.unquote(pw)  # the whole password, never a piece
    if encode:
        assert loc.password == secret
    texts = [str(loc), repr(loc)]
    try:
        create_stream(url, "a INT", 2)
    except RowtimeError as e:  # the server refused it: a raw password that decodes otherwise
        event("refused by the server")
        assert loc.password != secret
        texts.append(str(e) + "".join(traceback.format_exception(e)))
        assert admin.dbsize() == keys_before
    else:
        event("accepted whole")
        for command in (["describe", url], ["describe", "--json", url], ["metrics", url]):
            assert main(command) == 0
            out, err = capsys.readouterr()
            texts.append(out + err)
            assert "rt:***@127.0.0.1" in out
        texts.append(exposition([url]))
    wrong = url.replace(f"rt:{pw}@", f"rt:{pw}x@")
    texts.append(error_text(lambda: open_stream(wrong)))
    assert "refused the credentials" in texts[-1]
    for text in texts:
        assert leaked(secret, text) == [], text


# -- the catalog ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key, says",
    [
        ("aws_secret_access_key", "AWS_SECRET_ACCESS_KEY"),
        ("aws_session_token", "AWS_SESSION_TOKEN"),
        ("connection_string", "AZURE_STORAGE_ACCOUNT_KEY"),
        ("account_key", "AZURE_STORAGE_ACCOUNT_KEY"),
        ("AccountKey", "AZURE_STORAGE_ACCOUNT_KEY"),
        ("sas_token", "AZURE_STORAGE_SAS_TOKEN"),
        ("client_secret", "AZURE_CLIENT_SECRET"),
        ("password", "password_env"),
        ("token", "password_env"),
        ("api_key", "password_env"),
    ],
)
@pytest.mark.parametrize("table", ["streams.orders", "connectors.files"])
def test_a_catalog_key_that_names_a_secret_is_refused_without_its_value(
    tmp_path: Path, key: str, says: str, table: str
) -> None:
    value = "¤s3cr3t/v@lue§"
    text = (
        '[streams.orders]\nlocation = "data"\nschema = "a INT"\n\n'
        '[connectors.files]\nkind = "directory"\nstream = "orders"\npath = "in"\n'
    )
    head = f"[{table}]\n"
    text = text.replace(head, f'{head}{key} = "{value}"\n')
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    with pytest.raises(CatalogError) as info:
        load_catalog(path)
    message = str(info.value)
    assert f"{table}.{key}" in message and "never written in a catalog" in message
    assert says in message  # where the secret belongs instead
    assert leaked(value, message) == [], message
    line = text.splitlines().index(f'{key} = "{value}"') + 1
    assert message.startswith(f"{path}:{line}: ")


def test_a_catalog_location_with_a_signature_is_refused_without_it(tmp_path: Path) -> None:
    path = catalog_with(tmp_path, "az://box/orders?sv=2022-11-02&sig=¤abc§")
    with pytest.raises(CatalogError) as info:
        load_catalog(path)
    assert "token or a signature" in str(info.value) and leaked("¤abc§", str(info.value)) == []


def test_describe_never_shows_the_password_of_a_missing_or_pending_redis_stream(
    acl_redis: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from pyspark_rowtime.streams.sink_state import SINK_KIND_STREAM

    secret = "¤default§pw"
    url = f"redis://:{urllib.parse.quote(secret)}@127.0.0.1:{acl_redis.port}/0/pending"
    assert main(["describe", url]) == 2  # nothing there: one line, without the password
    out, err = capsys.readouterr()
    assert leaked(secret, out + err) == [] and re.search(r":\*\*\*@127\.0\.0\.1", err)
    # A sink's stream target before its first commit: describe prints its location (as the
    # backend resolves it: the location as given, password and all, before this was redacted).
    target = json.dumps({"kind": SINK_KIND_STREAM})
    acl_redis.client().set(parse_location(url).key("sink", "target"), target)
    for command in (["describe", url], ["describe", "--json", url]):
        assert main(command) == 0
        out, err = capsys.readouterr()
        assert "not created yet" in out or '"created": false' in out
        assert leaked(secret, out + err) == [] and ":***@127.0.0.1" in out
