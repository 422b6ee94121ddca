"""Who may use the queue service, and what a request may carry: the checks made before a handler
sees a request (vidgen.queue.service builds the app behind them).

- Without a token, only requests addressed to a loopback name are answered (DNS rebinding: a page
  whose name was pointed at 127.0.0.1 sends its own name as Host).
- With one, every request carries it (Bearer header or the login cookie); wrong tokens, by any
  route, count against the peer address of the connection (never a header a client writes), and
  AUTH_TRIES of them within AUTH_WINDOW_S lock that address out until the window has passed. A
  token for another address than loopback must be hard to guess (token_problem).
- Headers are read as latin-1 and tokens compared as bytes, so no header is a decoding error; a
  JSON body nests at most MAX_DEPTH levels and holds no NUL, lone surrogate or integer beyond 64
  bits (check_json).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from collections import OrderedDict
from typing import Any

from ..text import text_flaw
from .jobs import _sqlite_int

log = logging.getLogger("vidgen")

LOOPBACK = ("127.0.0.1", "localhost", "::1")
COOKIE = "vidgen_session"
AUTH_TRIES = 5                                           # wrong tokens per peer address per minute before 429
AUTH_WINDOW_S = 60.0
AUTH_PEERS = 4096                                        # peers remembered (the oldest forgotten first)
MIN_TOKEN = 32                                           # characters of a token for another address than loopback
MIN_TOKEN_KINDS = 10                                     # ... of which this many different ones
TOKEN_HINT = 'make one with: python -c "import secrets; print(secrets.token_urlsafe(32))"'
MAX_DEPTH = 32                                           # nesting of a JSON request body


def session_value(token: str) -> str:
    """What the login cookie holds: derived from the token, not the token itself."""
    return hmac.new(token.encode(), b"vidgen queue session", hashlib.sha256).hexdigest()


class Failures:
    """Wrong tokens per peer address, in a bounded table (the peers longest quiet are forgotten first)."""

    def __init__(self):
        self.times: OrderedDict[str, list[float]] = OrderedDict()    # peer address -> times of wrong tokens

    def __len__(self) -> int:
        return len(self.times)

    def locked(self, peer: str) -> bool:
        """Whether `peer` gave AUTH_TRIES wrong tokens within the last AUTH_WINDOW_S."""
        now = time.monotonic()
        recent = [t for t in self.times.get(peer, []) if now - t < AUTH_WINDOW_S]
        if recent:
            self.times[peer] = recent
        else:
            self.times.pop(peer, None)
        return len(recent) >= AUTH_TRIES

    def failed(self, peer: str) -> None:
        """Count a wrong token from `peer`; the table stays bounded (the peers longest quiet go first)."""
        self.times[peer] = [*self.times.pop(peer, []), time.monotonic()][-AUTH_TRIES:]
        while len(self.times) > AUTH_PEERS:
            self.times.popitem(last=False)


def check_json(data: Any) -> list[str]:
    """What a parsed request body holds that no handler may see: nesting deeper than MAX_DEPTH, a
    string (or key) with NUL or a lone surrogate, an integer beyond 64 bits. Iterative, so a deep
    body cannot exhaust the stack here."""
    problems, todo = [], [(data, "body", 1)]
    while todo and len(problems) < 10:
        x, where, depth = todo.pop()
        if depth > MAX_DEPTH:
            return [f"the request body nests deeper than {MAX_DEPTH} levels"]
        if isinstance(x, dict):
            todo += [(v, f"{where}.{k}" if _plain(k) else f"{where}[...]", depth + 1) for k, v in x.items()]
            todo += [(k, f"{where} (a key)", depth + 1) for k in x if not _plain(k)]
        elif isinstance(x, list):
            todo += [(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(x)]
        elif isinstance(x, str) and (flaw := text_flaw(x)):
            problems.append(f"{where}: a NUL character is not allowed in a string" if flaw[0] == "nul" else
                            f"{where}: not valid Unicode (a lone surrogate)")
        elif isinstance(x, int) and not isinstance(x, bool) and not _sqlite_int(x):
            problems.append(f"{where}: {'-' if x < 0 else ''}an integer of {len(str(abs(x)))} digits is beyond 64 bits")
    return problems


def _plain(key: str) -> bool:
    return len(key) <= 64 and key.isprintable()       # NUL and lone surrogates are not printable


def no_constants(name: str):
    raise ValueError(f"{name} is not JSON")


INTERNAL = "internal error in the queue service; its log has the details"
"""What a client is told of an unexpected error (the traceback goes to the service's log)."""
SEED_FIXED = "seed: a job's seed is fixed when it is queued, so every attempt renders the same clip; give an integer"
"""An edit that would leave a queued job's seed null (a retry could then render another clip)."""


def peer(scope) -> str:
    """The address of the socket's other end: never a header (X-Forwarded-For is the client's to set)."""
    client = scope.get("client")
    return str(client[0]) if client else "?"


def same(given: bytes, token: str) -> bool:
    """Constant-time comparison of bytes a client sent with the token (any bytes: no TypeError)."""
    return hmac.compare_digest(given, token.encode("utf-8"))


def host_name(host: str) -> str:
    """The name in a Host header, without its port: `[::1]:8765` -> `::1`, `Localhost.` -> `localhost`."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    name, _, port = host.rpartition(":") if host.count(":") == 1 else (host, "", "")
    return (name if port.isdigit() else host).rstrip(".")


class Guard:
    """ASGI wrapper, before the app sees a request: the Host (only loopback names without a token),
    the token (when set; wrong ones rate-limited per peer), cross-site writes, the body size limit.
    Nothing here raises: a request it cannot parse gets a 4xx, and an unexpected error a JSON 500."""

    def __init__(self, app, svc, response_cls):
        self.app, self.svc, self.Response = app, svc, response_cls
        self.state = app.state

    async def refuse(self, scope, receive, send, status: int, message: str, headers: dict | None = None):
        body = json.dumps({"error": message}).encode()
        await self.Response(body, status_code=status, media_type="application/json", headers=headers)(scope, receive,
                                                                                                        send)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracked(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)
        try:
            return await self._handle(scope, receive, tracked)
        except Exception:
            log.exception("queue service: %s %s", scope.get("method"), scope.get("path", "")[:200])
            if not started:
                await self.refuse(scope, receive, send, 500, INTERNAL)

    async def _handle(self, scope, receive, send):
        # Header values are bytes; HTTP allows any octet in them, so they are read as latin-1 (never a
        # UnicodeDecodeError) and tokens are compared as bytes.
        headers = {k.decode("latin-1").lower(): v for k, v in scope.get("headers", [])}
        text = {k: v.decode("latin-1") for k, v in headers.items()}
        path, method = scope.get("path", ""), scope.get("method", "GET")
        if not self.svc.token and host_name(text.get("host", "")) not in LOOPBACK:
            shown = text.get("host", "")[:60].encode("ascii", "replace").decode()
            return await self.refuse(scope, receive, send, 421,
                                     f"Host {shown!r} is not a loopback name; without a token the service answers only "
                                     "to localhost, 127.0.0.1 and [::1] (give it a token to serve other names)")
        if self.svc.token and not path.startswith(("/login", "/static/")):
            who = peer(scope)
            if self.svc.failures.locked(who):
                return await self.refuse(scope, receive, send, 429, "too many wrong tokens from this address; wait a "
                                                                    "minute", {"Retry-After": str(int(AUTH_WINDOW_S))})
            verdict = self._authorised(headers)
            if verdict is not True:
                if verdict is False:            # a token was given, and it was wrong
                    self.svc.failures.failed(who)
                if path.startswith(("/api/", "/v1/")):
                    return await self.refuse(scope, receive, send, 401,
                                             "a token is needed: Authorization: Bearer TOKEN")
                return await self.Response(status_code=303, headers={"Location": "/login"})(scope, receive, send)
        if method not in ("GET", "HEAD") and self._cross_site(text):
            return await self.refuse(scope, receive, send, 403, "a request from another site's page is refused")
        too_big = f"the request body is larger than {self.svc.max_body} bytes"
        length = text.get("content-length")
        if length is not None and (not length.isdigit() or len(length) > 19 or int(length) > self.svc.max_body):
            return await self.refuse(scope, receive, send, 413, too_big)
        if method in ("GET", "HEAD"):
            return await self.app(scope, receive, send)
        # The whole body, counted as it arrives (a chunked one has no length to check first), then replayed.
        chunks, seen, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return
            chunks.append(message.get("body", b""))
            seen, more = seen + len(chunks[-1]), message.get("more_body", False)
            if seen > self.svc.max_body:
                return await self.refuse(scope, receive, send, 413, too_big)
        replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def buffered():
            return replay.pop() if replay else await receive()
        return await self.app(scope, buffered, send)

    @staticmethod
    def _cross_site(headers: dict) -> bool:
        """A write sent by a page of another origin (a browser names it in Origin / Sec-Fetch-Site)."""
        if headers.get("sec-fetch-site") in ("cross-site", "same-site"):
            return True
        origin = headers.get("origin")
        return origin is not None and origin.split("://", 1)[-1] != headers.get("host", "")

    def _authorised(self, headers: dict) -> bool | None:
        """True: the request carries the token (or the login cookie); False: it carries a wrong one;
        None: it carries none."""
        token, given = self.svc.token, False
        auth = headers.get("authorization", b"")
        if auth[:7].lower() == b"bearer ":
            if same(auth[7:].strip(), token):
                return True
            given = True
        for part in headers.get("cookie", b"").split(b";"):
            name, _, value = part.strip().partition(b"=")
            if name == COOKIE.encode():
                if hmac.compare_digest(value, session_value(token).encode()):
                    return True
                given = True
        return False if given else None


def token_problem(token: str | None, host: str) -> str | None:
    """Why `token` cannot guard the service on `host`: none, or too easy to guess, for an address
    other than loopback (a one-character token would fall to a few hundred guesses); any token must
    be printable ASCII (an HTTP header carries it)."""
    if token is None:
        if host in LOOPBACK:
            return None
        return (f"--host {host}: the service binds to another address than this machine's only with a token "
                f"(--token or VIDGEN_TOKEN); every request must then carry it; {TOKEN_HINT}")
    if not (token.isascii() and token.isprintable()) or " " in token:
        return f"--token: give printable ASCII characters without spaces (an HTTP header carries it); {TOKEN_HINT}"
    if host not in LOOPBACK and (len(token) < MIN_TOKEN or len(set(token)) < MIN_TOKEN_KINDS):
        return (f"--token: a token for --host {host} needs at least {MIN_TOKEN} characters, {MIN_TOKEN_KINDS} of them "
                f"different (this one has {len(token)}, {len(set(token))} different); {TOKEN_HINT}")
    return None
