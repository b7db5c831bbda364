"""URLs from a job config: their form checked once, and never printed with their secrets.

A URL may carry credentials (`http://user:password@host/`) or a key in its query string
(`?api_key=...`). Whatever prints a URL (errors, failure reasons, logs) prints
`redact_url(url)`: the password and the whole query become `***`, and the fragment is dropped.
`redact_urls` does the same to every URL inside a text (an exception message that quotes one),
as a second line of defence where a job's failure reason is stored.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

HIDDEN = "***"
# scheme://[userinfo@]rest[?query|#fragment], ending at whitespace or a quote or bracket; the
# scheme's length is bounded so that a long run of letters costs linear time, not quadratic
_URL_IN_TEXT = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]{0,31}://)(?P<userinfo>[^\s/?#@'\"<>]*@)?"
    r"(?P<rest>[^\s?#'\"<>]*)(?P<query>[?#][^\s'\"<>)]*)?")


def redact_url(url: str) -> str:
    """`url` as it may be printed: user kept, password, query and fragment hidden."""
    match = _URL_IN_TEXT.fullmatch(url.strip())
    if match is None:  # not a URL at all: show nothing of it that could be a secret
        return url if "@" not in url and "?" not in url else HIDDEN
    return _redacted(match)


def redact_urls(text: str) -> str:
    """`text` with every URL in it redacted (see `redact_url`)."""
    return _URL_IN_TEXT.sub(_redacted, text)


def _redacted(match: re.Match[str]) -> str:
    userinfo = match["userinfo"] or ""
    if userinfo:
        user = userinfo[:-1].split(":", 1)[0]
        userinfo = f"{user}:{HIDDEN}@" if ":" in userinfo else f"{HIDDEN}@"
    query = f"?{HIDDEN}" if match["query"] else ""
    return f"{match['scheme']}{userinfo}{match['rest']}{query}"


def http_url_problem(url: str, key: str) -> str | None:
    """Why `url` (the value of config `key`) cannot be requested over http(s), or None: the
    scheme, the host and the port are checked here, at config time, not at the first step."""
    parts = urlsplit(url)
    shown = redact_url(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{key} {shown!r} is not an http(s) URL; write it as http://host:port/path"
    try:
        port = parts.port
    except ValueError:  # non-numeric, or beyond 65535 (which would wrap modulo 65536)
        port = 0
    if port == 0 or (port is None and parts.netloc.rsplit("@", 1)[-1].endswith(":")):
        return (f"{key} {shown!r} has an invalid port: a port is a number from 1 to 65535 "
                "(or leave it out for the scheme's default)")
    return None
