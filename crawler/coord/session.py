"""Sessions the whole fleet shares: a site's cookie jar and its login, kept in Redis.

**The jar** (``cookies = True``, or a ``login_url``): one per site, in the hash
``keys.cookies(SITE)``, one field per cookie (``[domain, path, name]``, as RFC 6265 tells
cookies apart) holding the cookie as JSON. The rules (domain and path matching, ``Secure``,
``Expires``/``Max-Age``, deletion by an expired ``Set-Cookie``) are Python's
``http.cookiejar``, driven through httpx's ``Cookies``: nothing here parses a cookie. A
response's ``Set-Cookie`` headers are applied to the jar as read, and only the cookies they
change are written (``HSET``) or deleted (``HDEL``): two workers updating the jar at once
merge, neither loses the other's cookies. Expired cookies are dropped when read.

**The login** (``login_url`` and ``login(page) -> Request``): the hash ``keys.session(SITE)``
holds ``state`` (``ok`` while logged in) and ``generation`` (how many logins so far). A
worker that finds no session takes the lease ``keys.login_lease(SITE)`` (``SET NX PX``) and
logs in, each request through the site's gate; the others hand their pages back to the
delayed set for ``LOGIN_WAIT`` and look again then, holding neither gate nor thread. A
worker that dies while logging in lets its lease expire, and the next page starts a login.
``logged_out(page)`` answering True ends the session the request was sent with, and only
that one (``end``: a compare-and-set on the generation), so a fleet that sees many
logged-out pages of one session logs in again once.

Cookie values are secrets: ``Response.headers`` never holds ``Set-Cookie`` (``fetch``),
and what is shown of one goes through ``redacted_set_cookie``.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterable
from http.cookiejar import Cookie, CookieJar
from typing import Any

import httpx
import redis

from . import keys

#: Seconds a page waits (in the delayed set) while another worker logs the site in, before it looks again.
LOGIN_WAIT = 0.5
#: A login's lease, seconds: past it, a worker that died while logging in is replaced by another.
LOGIN_LEASE = 60.0
#: ``state`` of a logged-in session.
LOGGED_IN = "ok"

#: The arguments of ``http.cookiejar.Cookie``, as a cookie is kept in Redis.
_COOKIE_ARGS = (
    "version",
    "name",
    "value",
    "port",
    "port_specified",
    "domain",
    "domain_specified",
    "domain_initial_dot",
    "path",
    "path_specified",
    "secure",
    "expires",
    "discard",
    "comment",
    "comment_url",
    "rfc2109",
)


def uses_cookies(spider: Any) -> bool:
    """Whether ``spider``'s requests carry the site's jar: ``cookies = True``, or a login (which needs one)."""
    return bool(getattr(spider, "cookies", False)) or logs_in(spider)


def logs_in(spider: Any) -> bool:
    """Whether the fleet logs in to ``spider``'s site before its other requests."""
    return getattr(spider, "login_url", None) is not None


def _field(cookie: Cookie) -> str:
    return json.dumps([cookie.domain, cookie.path, cookie.name])


def _dump(cookie: Cookie) -> str:
    kept = {name: getattr(cookie, name) for name in _COOKIE_ARGS}
    # The attributes http.cookiejar keeps unnamed (HttpOnly, SameSite): it has no public accessor for them.
    kept["rest"] = getattr(cookie, "_rest", {})
    return json.dumps(kept, separators=(",", ":"))


def _load(value: bytes | str) -> Cookie:
    return Cookie(**json.loads(value))


class Jar:
    """``site``'s cookie jar in Redis (see the module docstring)."""

    def __init__(self, connection: redis.Redis, site: str):
        self.connection = connection
        self.key = keys.cookies(site)

    def _read(self) -> CookieJar:
        """The jar as kept, its expired cookies dropped (from Redis too)."""
        jar = CookieJar()
        expired = []
        now = int(time.time())
        for name, value in self.connection.hgetall(self.key).items():
            cookie = _load(value)
            if cookie.is_expired(now):
                expired.append(name)
            else:
                jar.set_cookie(cookie)
        if expired:
            self.connection.hdel(self.key, *expired)
        return jar

    def header(self, url: str) -> dict[str, str]:
        """The ``Cookie`` header to send with a request for ``url`` (empty when no cookie matches)."""
        request = httpx.Request("GET", url)
        httpx.Cookies(self._read()).set_cookie_header(request)
        cookie = request.headers.get("cookie")
        return {"cookie": cookie} if cookie else {}

    def update(self, url: str, set_cookies: Iterable[str]) -> None:
        """Apply a response's ``Set-Cookie`` headers (for a request of ``url``) to the jar.

        Only the cookies they set or delete are written: another worker's update meanwhile
        is kept. A cookie refused by the rules (another domain, say) is not stored.
        """
        headers = [("set-cookie", value) for value in set_cookies]
        if not headers:
            return
        jar = self._read()
        before = {_field(cookie): _dump(cookie) for cookie in jar}
        response = httpx.Response(200, headers=headers, request=httpx.Request("GET", url))
        httpx.Cookies(jar).extract_cookies(response)
        after = {_field(cookie): _dump(cookie) for cookie in jar}
        changed = {name: value for name, value in after.items() if before.get(name) != value}
        deleted = [name for name in before if name not in after]
        if not changed and not deleted:
            return
        pipe = self.connection.pipeline(transaction=True)
        if changed:
            pipe.hset(self.key, mapping=changed)  # type: ignore[arg-type]
        if deleted:
            pipe.hdel(self.key, *deleted)
        pipe.execute()

    def names(self) -> list[str]:
        """The names of the cookies in force (never their values); expired ones are dropped."""
        return sorted(cookie.name for cookie in self._read())


class Session:
    """``site``'s login, shared by the fleet (see the module docstring)."""

    def __init__(self, connection: redis.Redis, site: str, lease: float = LOGIN_LEASE):
        self.connection = connection
        self.key = keys.session(site)
        self.lease_key = keys.login_lease(site)
        self.lease = lease

    def generation(self) -> int | None:
        """The generation of the session in force, or None when the site is not logged in."""
        state, generation = self.connection.hmget(self.key, ["state", "generation"])
        if state is None or (state.decode() if isinstance(state, bytes) else state) != LOGGED_IN:
            return None
        return int(generation or 0)

    def lead(self) -> str | None:
        """Take the lease to log in (a token), or None when another worker holds it."""
        token = secrets.token_hex(8)
        taken = self.connection.set(self.lease_key, token, nx=True, px=max(1, int(self.lease * 1000)))
        return token if taken else None

    def logged_in(self, token: str) -> int:
        """Mark the site logged in (a new generation) and give the lease back; the new generation."""
        pipe = self.connection.pipeline(transaction=True)
        pipe.hincrby(self.key, "generation", 1)
        pipe.hset(self.key, "state", LOGGED_IN)
        generation = int(pipe.execute()[0])
        self.let_go(token)
        return generation

    def let_go(self, token: str) -> None:
        """Give the lease back, if it is still ours (a lease that expired may be another worker's now)."""
        key = self.lease_key
        self._compare_and_set(key, lambda pipe: pipe.get(key), token, lambda pipe: pipe.delete(key))

    def end(self, generation: int) -> bool:
        """End the session of ``generation`` (a page said it was logged out); False if it had ended already.

        Only the first worker to see a logged-out page of the session in force ends it: a
        page sent with an older session says nothing about the new one.
        """

        def current(pipe: Any) -> Any:
            state, number = pipe.hmget(self.key, ["state", "generation"])
            return f"{state.decode() if state else ''}:{int(number or 0)}"

        return self._compare_and_set(
            self.key, current, f"{LOGGED_IN}:{generation}", lambda pipe: pipe.hdel(self.key, "state")
        )

    def _compare_and_set(
        self, key: str, read: Callable[[Any], Any], expected: str, write: Callable[[Any], Any]
    ) -> bool:
        """``write`` in a transaction if ``read`` gives ``expected`` and ``key`` does not change meanwhile."""
        with self.connection.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(key)
                found = read(pipe)
                if (found.decode() if isinstance(found, bytes) else found) != expected:
                    return False
                pipe.multi()
                write(pipe)
                pipe.execute()
                return True
            except redis.WatchError:  # changed meanwhile: someone else did it
                return False


def redacted_set_cookie(value: str) -> str:
    """A ``Set-Cookie`` value fit to show: its name and attributes, its value replaced."""
    pair, separator, attributes = value.partition(";")
    name = pair.partition("=")[0].strip()
    return f"{name}=(redacted){separator}{attributes}"
