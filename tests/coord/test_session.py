"""Sessions across the fleet: one cookie jar per site in Redis, one login for every worker.

Loopback apps written here with http.server need each feature: a consent cookie the later
pages require; a login form with a per-render CSRF token and a session cookie; a session
that the app ends after some pages, while two download worker processes crawl.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from crawling import installed_runtime, items_by_key, run_in_threads
from redis import Redis
from routes import Answer, Routes
from routes import serving as serving_routes

from crawler.coord import keys
from crawler.coord.frontier import seed
from crawler.coord.session import (
    MAX_COOKIE_AGE,
    MAX_COOKIE_BYTES,
    MAX_COOKIES,
    MAX_COOKIES_PER_DOMAIN,
    Jar,
    Session,
    redacted_set_cookie,
)
from crawler.demo.wire import WireStampedHandler, WireStampedServer
from crawler.ops.failures import failed_pages
from crawler.ops.reset import reset_site
from crawler.settings import Settings
from crawler.spiders.check import check_spider
from crawler.spiders.spider import Page, Request, Spider
from crawler.store.database import Store

PAGES = 24
#: Seconds the app takes to answer a request sent with its ended session.
EXPIRED_LATENCY = 1.0


class App:
    """A loopback site: its state, shared by its handler threads, and every request's wire arrival."""

    def __init__(self, expire_first_session_after: int | None = None):
        self.lock = threading.Lock()
        self.consent = "consent-" + secrets.token_hex(12)  # cookie values the output must never show
        self.sessions: dict[str, int] = {}  # session cookie value -> pages served under it
        self.csrf: set[str] = set()
        self.logins = 0
        self.arrivals: list[float] = []
        self.paths: list[str] = []
        self.expire_first_after = expire_first_session_after
        self.first_session: str | None = None
        self.secrets_given: list[str] = [self.consent]
        self.api_key = "key-" + secrets.token_hex(8)
        self.api_pages: list[int] = []  # the JSON API's pages served, in order

    def gaps(self) -> list[float]:
        stamps = sorted(self.arrivals)
        return [b - a for a, b in zip(stamps, stamps[1:], strict=False)]


def _handler(app: App) -> type[WireStampedHandler]:
    class Handler(WireStampedHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _cookies(self) -> dict[str, str]:
            jar = SimpleCookie(self.headers.get("cookie", ""))
            return {name: morsel.value for name, morsel in jar.items()}

        def _send(self, body: str, status: int = 200, cookie: str | None = None) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("content-type", "text/html; charset=utf-8")
            self.send_header("content-length", str(len(data)))
            if cookie:
                self.send_header("set-cookie", cookie)
            self.send_header("set-cookie", "tracker=1; Path=/; Max-Age=0")  # a second Set-Cookie, deleting
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            arrival = self.arrival()
            parts = urlsplit(self.path)
            with app.lock:
                app.arrivals.append(arrival)
                app.paths.append(parts.path)
            if parts.path.startswith("/consent"):
                self._consent(parts.path)
            else:
                self._members(parts.path, parse_qs(parts.query))

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            arrival = self.arrival()
            parts = urlsplit(self.path)
            form = self.rfile.read(int(self.headers.get("content-length") or 0)).decode()
            with app.lock:
                app.arrivals.append(arrival)
                app.paths.append(parts.path)
            if parts.path == "/api/items":
                self._api(form)
            else:
                self._members(parts.path, parse_qs(form))

        def _api(self, body: str) -> None:
            """A JSON API paged by POST: ``{"page": N}`` in, five items and the next page out; it needs
            the session (its cookie) and the API key header."""
            with app.lock:
                logged_in = self._cookies().get("sid", "") in app.sessions
            if not logged_in or self.headers.get("x-api-key") != app.api_key:
                data, status = json.dumps({"error": "log in and give your key"}).encode(), 403
            else:
                number = int(json.loads(body)["page"])
                with app.lock:
                    app.api_pages.append(number)
                items = [{"sku": f"A-{number}-{i}"} for i in range(5)]
                data, status = json.dumps({"items": items, "next": number + 1 if number < 4 else None}).encode(), 200
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _consent(self, path: str) -> None:
            if path == "/consent/":
                links = "".join(f'<a href="/consent/p/{i}">{i}</a>' for i in range(1, 11))
                self._send(f"<html><body>{links}</body></html>", cookie=f"consent={app.consent}; Path=/consent")
            elif self._cookies().get("consent") == app.consent:
                self._send(f'<html><body><h1 class="sku">C-{path.rsplit("/", 1)[1]}</h1></body></html>')
            else:
                self._send("<html><body><p>Accept our cookies first.</p></body></html>")

        def _login_page(self) -> None:
            token = secrets.token_hex(8)
            with app.lock:
                app.csrf.add(token)
            form = (
                '<form id="login" method="post" action="/do-login"><input type="hidden" name="token" '
                f'value="{token}"><input name="user"></form>'
            )
            self._send(f"<html><body>{form}</body></html>")

        def _members(self, path: str, query: dict[str, list[str]]) -> None:
            if path == "/login":
                self._login_page()
                return
            if path == "/do-login":
                token = query.get("token", [""])[0]
                with app.lock:
                    known = token in app.csrf
                    app.csrf.discard(token)
                    valid = known and query.get("user") == ["alice"]
                    if valid:
                        app.logins += 1
                        sid = secrets.token_hex(16)
                        app.sessions[sid] = 0
                        app.secrets_given.append(sid)
                        if app.first_session is None:
                            app.first_session = sid
                if known and not valid:  # credentials refused: the login form again, as many sites answer
                    self._login_page()
                    return
                if not valid:
                    self._send("bad token", status=403)
                    return
                self._send("<html><body>welcome</body></html>", cookie=f"sid={sid}; Path=/; HttpOnly")
                return
            sid = self._cookies().get("sid", "")
            with app.lock:
                served = app.sessions.get(sid)
                if served is not None:
                    app.sessions[sid] = served + 1
                    if sid == app.first_session and app.expire_first_after and served + 1 > app.expire_first_after:
                        del app.sessions[sid]  # the app ends the first session mid-crawl
                        served = None
            if sid and sid == app.first_session and served is None:
                # Slow to say so: the fleet's other requests of the old session come back logged out
                # after the new login, and must not end the new session.
                time.sleep(EXPIRED_LATENCY)
            if served is None:  # not logged in: the login page, as many sites answer (200)
                self._login_page()
            elif path == "/":
                links = "".join(f'<a href="/p/{i}">{i}</a>' for i in range(1, PAGES + 1))
                self._send(f"<html><body>{links}</body></html>")
            else:
                self._send(f'<html><body><h1 class="sku">M-{path.rsplit("/", 1)[1]}</h1></body></html>')

    return Handler


@contextmanager
def serving(app: App) -> Iterator[str]:
    server = WireStampedServer(("127.0.0.1", 0), _handler(app))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _cli(redis_url: str, sqlite_url: str, sites: Path, *args: str) -> list[str]:
    return [sys.executable, "-c", "from crawler.cli.app import main; main()", "--redis-url", redis_url,
            "--database-url", sqlite_url, "--sites", str(sites), *args]  # fmt: skip


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CRAWLER_") and k != "REDIS_URL"}


def _run(command: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=timeout)


def _write_spider(sites: Path, source: str) -> None:
    sites.mkdir(exist_ok=True)
    (sites / "site.py").write_text(textwrap.dedent(source))


CONSENT_SPIDER = """
    from crawler import Spider

    class Consent(Spider):
        name = "consent"
        start_urls = ["{url}/consent/"]
        interval = 0.05
        obey_robots = False
        item_key = "sku"
        cookies = {cookies}

        def parse(self, page):
            yield from page.follow_all("a", callback=self.parse_page)

        def parse_page(self, page):
            node = page.css_first("h1.sku")
            if node is not None:
                yield {{"sku": node.text(), "sent": sorted(h.lower() for h in page.request.headers)}}
"""


def test_a_consent_cookie_is_kept_and_sent_with_cookies_on_and_never_shown_by_fetch(
    redis_url: str, redis_conn: Redis, sqlite_url: str, tmp_path: Path
) -> None:
    sites = tmp_path / "sites"
    app = App()
    with serving(app) as url:
        _write_spider(sites, CONSENT_SPIDER.format(url=url, cookies=False))
        without = _run(_cli(redis_url, sqlite_url, sites, "crawl", "consent", "-n", "1"))
        assert without.returncode == 0, without.stderr[-2000:]
        assert items_by_key(sqlite_url, "consent") == {}  # no cookie: every page is the consent wall

        _write_spider(sites, CONSENT_SPIDER.format(url=url, cookies=True))
        crawled = _run(_cli(redis_url, sqlite_url, sites, "crawl", "consent", "--fresh", "-n", "1"))
        assert crawled.returncode == 0, crawled.stderr[-2000:]
        stored = items_by_key(sqlite_url, "consent")
        assert set(stored) == {f"C-{i}" for i in range(1, 11)}
        # The jar's Cookie header is the fetcher's: it does not ride with the page to the parse workers.
        assert all("cookie" not in item["sent"] for item in stored.values()), stored
        assert Jar(redis_conn, "consent").names() == ["consent"]  # the deleting Set-Cookie left nothing
        assert redis_conn.exists(keys.cookies("consent"))

        fetched = _run(_cli(redis_url, sqlite_url, sites, "fetch", f"{url}/consent/", "--headers"))
    assert fetched.returncode == 0, fetched.stderr
    assert "set-cookie: consent=(redacted); Path=/consent" in fetched.stdout
    for output in (without, crawled, fetched):
        assert app.consent not in output.stdout + output.stderr


def test_the_jar_follows_rfc_6265_and_concurrent_updates_merge(
    fake_redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [time.time()]  # the jar's clock, moved by hand: gone=1 lives until the second is out
    monkeypatch.setattr(time, "time", lambda: clock[0])
    one, two = Jar(fake_redis, "s"), Jar(fake_redis, "s")  # two workers' views of one jar
    one.update("http://a.test/x/page", ["a=1; Path=/x", "gone=1; Max-Age=1"])
    two.update("http://a.test/other", ["b=2; Path=/", "safe=3; Secure", "far=4; Domain=elsewhere.test"])
    sent = one.header("http://a.test/x/y")["cookie"].split("; ")
    assert sorted(sent) == ["a=1", "b=2", "gone=1"]  # path-matched; Secure only over https
    assert sorted(one.header("https://a.test/other")["cookie"].split("; ")) == ["b=2", "safe=3"]  # not /x's
    assert one.header("http://elsewhere.test/") == {}  # a domain the response could not set
    one.update("http://a.test/", ["b=; Path=/; Expires=Thu, 01 Jan 1970 00:00:00 GMT"])  # deleted by the server
    clock[0] += 1.0  # gone=1 expires
    assert Jar(fake_redis, "s").names() == ["a", "safe"]
    assert sorted(fake_redis.hkeys(keys.cookies("s"))) == sorted(  # expired ones dropped from Redis too
        [b'["a.test", "/x", "a"]', b'["a.test", "/", "safe"]']
    )


def test_only_the_first_worker_to_see_a_session_logged_out_ends_it(fake_redis: Redis) -> None:
    session = Session(fake_redis, "s")
    token = session.lead()
    assert token is not None and session.lead() is None  # one worker logs in
    assert session.logged_in(token) == 1 and session.generation() == 1
    assert session.lead() is not None  # the lease was given back
    fake_redis.delete(keys.login_lease("s"))
    assert session.end(1) and not session.end(1)  # the second worker's logged-out page: already ended
    token = session.lead()
    assert token is not None and session.logged_in(token) == 2
    assert not session.end(1)  # a page sent with the old session says nothing of the new one
    assert session.generation() == 2


LOGIN_SPIDER = """
    from crawler import Request, Spider

    class Members(Spider):
        name = "members"
        start_urls = ["{url}/"]
        interval = {interval}
        obey_robots = False
        item_key = "sku"
        login_url = "{url}/login"

        def login(self, page):
            # The form's POST, its per-render token (a hidden input) kept: page.form
            return page.form("form#login", data={{"user": "{user}"}})

        def logged_out(self, page):
            return page.css_first("form#login") is not None

        def parse(self, page):
            yield from page.follow_all("a", callback=self.parse_page)

        def parse_page(self, page):
            yield {{"sku": page.css_first("h1.sku").text()}}
"""


def test_two_worker_processes_log_in_once_and_once_more_when_the_session_expires_politely(
    redis_url: str, redis_conn: Redis, sqlite_url: str, tmp_path: Path
) -> None:
    interval = 0.1
    sites = tmp_path / "sites"
    app = App(expire_first_session_after=8)
    with serving(app) as url:
        _write_spider(sites, LOGIN_SPIDER.format(url=url, interval=interval, user="alice"))
        seeded = _run(_cli(redis_url, sqlite_url, sites, "seed", "members"))
        assert seeded.returncode == 0, seeded.stderr
        downloads = subprocess.Popen(
            _cli(redis_url, sqlite_url, sites, "worker", "download", "-n", "2", "--threads", "2", "--burst", "-v"),
            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        parse = subprocess.Popen(
            _cli(redis_url, sqlite_url, sites, "worker", "parse", "--burst", "-v"),
            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            download_log = downloads.communicate(timeout=120)[0]
            parse_log = parse.communicate(timeout=60)[0]
        finally:
            for process in (downloads, parse):
                if process.poll() is None:
                    process.kill()
        assert downloads.returncode == 0 and parse.returncode == 0, download_log[-3000:] + parse_log[-3000:]
        fetched = _run(_cli(redis_url, sqlite_url, sites, "fetch", f"{url}/p/1"))

    assert set(items_by_key(sqlite_url, "members")) == {f"M-{i}" for i in range(1, PAGES + 1)}
    assert app.logins == 2, f"{app.logins} logins: {app.paths}"  # once, and once more after the expiry
    assert app.paths.count("/login") == 2
    assert min(app.gaps()) >= interval, f"two requests {min(app.gaps()) * 1000:.1f} ms apart"
    store = Store(sqlite_url)
    try:
        workers = {row["worker"] for row in store.fetch_rows("members") if row["kind"] == "download"}
    finally:
        store.close()
    assert len(workers) >= 2, "the downloads were not shared between the two processes"
    assert "logged out (session 1" in download_log  # the expired session was seen, the page fetched again
    assert fetched.returncode == 0 and "M-1" in fetched.stdout  # fetch sends the fleet's session
    for secret in app.secrets_given:
        assert secret not in download_log + parse_log + fetched.stdout + fetched.stderr


def test_login_url_without_login_or_a_cookies_that_is_not_a_flag_is_refused_at_load() -> None:
    class NoLogin(Spider):
        name = "x"
        login_url = "http://a.test/login"

    class BadCookies(Spider):
        name = "y"
        cookies = "yes"  # type: ignore[assignment]

    class OutWithoutLogin(Spider):
        name = "z"

        def logged_out(self, page: Page) -> bool:
            return True

    class Fine(Spider):
        name = "w"
        login_url = "http://a.test/login"

        def login(self, page: Page) -> Request:
            return Request("http://a.test/do-login")

    assert "NoLogin.login_url needs a login(self, page) method" in (check_spider(NoLogin) or "")
    assert "BadCookies.cookies must be True or False" in (check_spider(BadCookies) or "")
    assert "OutWithoutLogin.login_url must be set for logged_out" in (check_spider(OutWithoutLogin) or "")
    assert check_spider(Fine) is None


def test_a_reset_forgets_the_site_s_jar_and_session(redis_conn: Redis) -> None:
    Jar(redis_conn, "s").update("http://a.test/", ["sid=1; Path=/"])
    session = Session(redis_conn, "s")
    token = session.lead()
    assert token is not None and session.logged_in(token) == 1
    reset_site(redis_conn, "s")
    assert Jar(redis_conn, "s").names() == [] and session.generation() is None


def test_a_refused_login_fails_the_page_after_its_retries_and_the_crawl_drains(
    redis_conn: Redis, settings: Settings
) -> None:
    app = App()
    with serving(app) as url:
        _write_spider(Path(settings.sites_dir), LOGIN_SPIDER.format(url=url, interval=0.01, user="mallory"))
        with installed_runtime(redis_conn, settings) as rt:
            seed(rt.frontier("members"), [f"{url}/"])
            run_in_threads(rt, sites=("members",))
    store = Store(settings.database_url)
    try:
        rows = [row for row in store.fetch_rows("members") if row["url"] == f"{url}/"]
    finally:
        store.close()
    assert [row["outcome"] for row in rows] == ["retry"] * settings.max_retries + ["failed"]
    assert "login failed: the answer to the login request is still logged out" in rows[-1]["error"]
    assert app.paths.count("/do-login") == settings.max_retries + 1  # one login per attempt, none after
    assert "/" not in app.paths  # the page itself was never asked for without a session
    assert app.logins == 0 and Session(redis_conn, "members").generation() is None


def test_pages_wait_for_a_login_under_way_and_a_dead_worker_s_lease_runs_out(
    redis_conn: Redis, settings: Settings
) -> None:
    app = App()
    with serving(app) as url:
        _write_spider(Path(settings.sites_dir), LOGIN_SPIDER.format(url=url, interval=0.01, user="alice"))
        # A worker took the lease to log in and died: nothing renews it. Timed from before it is taken:
        # the lease runs out 1.5 s after (timed after seeding, a loaded machine's seed ate the margin).
        leased = time.time()
        redis_conn.set(keys.login_lease("members"), "dead-worker", px=1500)
        with installed_runtime(redis_conn, settings) as rt:
            seed(rt.frontier("members"), [f"{url}/"])
            run_in_threads(rt, sites=("members",))
    assert set(items_by_key(settings.database_url, "members")) == {f"M-{i}" for i in range(1, PAGES + 1)}
    assert app.logins == 1 and app.paths[:2] == ["/login", "/do-login"]  # nothing asked before the login
    assert min(app.arrivals) - leased >= 1.4  # the lease ran out first
    assert Session(redis_conn, "members").generation() == 1


API_SPIDER = """
    from crawler import Request, Spider

    class Members(Spider):
        name = "members"
        start_urls = ["{url}/"]
        interval = {interval}
        obey_robots = False
        item_key = "sku"
        login_url = "{url}/login"
        content_types = ("text/html", "application/json")
        headers = {{"X-Api-Key": "{key}"}}

        def login(self, page):
            return page.form("form#login", data={{"user": "alice"}})

        def parse(self, page):
            yield self.api_page(page, 1)

        def api_page(self, page, number):
            return Request(page.urljoin("/api/items"), method="POST", json={{"page": number}}, callback=self.parse_api)

        def parse_api(self, page):
            data = page.json()
            yield from data["items"]
            if data["next"]:
                yield self.api_page(page, data["next"])
"""


def test_a_json_api_paged_by_post_is_crawled_within_the_fleets_session_politely(
    redis_url: str, sqlite_url: str, tmp_path: Path
) -> None:
    """The issue's API: paged by POST (a JSON body), needing the session's cookie and a header; the
    login is the form's POST with its per-render CSRF token. Every request, the login's included,
    is spaced by the interval at the server."""
    interval = 0.05
    sites = tmp_path / "sites"
    app = App()
    with serving(app) as url:
        _write_spider(sites, API_SPIDER.format(url=url, interval=interval, key=app.api_key))
        crawled = _run(
            _cli(redis_url, sqlite_url, sites, "crawl", "members", "--fresh")
        )  # another test's session stays in Redis
    assert crawled.returncode == 0, crawled.stderr[-3000:]
    assert set(items_by_key(sqlite_url, "members")) == {f"A-{n}-{i}" for n in range(1, 5) for i in range(5)}
    assert app.api_pages == [1, 2, 3, 4]  # each page once: POSTs told apart by their bodies
    assert app.logins == 1 and app.paths[:2] == ["/login", "/do-login"]
    assert min(app.gaps()) >= interval, f"two requests {min(app.gaps()) * 1000:.1f} ms apart"


JAR_SPIDER = """
    from crawler import Spider

    class Jarred(Spider):
        name = "jarred"
        start_urls = ["{url}/"]
        interval = 0.01
        obey_robots = False
        item_key = "sku"
        cookies = True

        def parse(self, page):
            yield {{"sku": page.text("h1")}}
            yield from page.follow_all("a")
"""


def _crawl_jarred(redis_conn: Redis, settings: Settings, routes: Routes) -> None:
    """Crawl ``routes`` (its "/" first) with JAR_SPIDER, in-process workers until the crawl drains."""
    with serving_routes(routes) as url:
        _write_spider(Path(settings.sites_dir), JAR_SPIDER.format(url=url))
        with installed_runtime(redis_conn, settings) as rt:
            seed(rt.frontier("jarred"), [f"{url}/"])
            run_in_threads(rt, sites=("jarred",), timeout=30)


def _outcomes(database_url: str, site: str) -> dict[str, list[tuple[str, str | None]]]:
    """Each URL path's fetch records, (outcome, error), oldest first."""
    store = Store(database_url)
    try:
        rows = [row for row in store.fetch_rows(site) if row["kind"] == "download"]
    finally:
        store.close()
    outcomes: dict[str, list[tuple[str, str | None]]] = {}
    for row in rows:
        outcomes.setdefault(urlsplit(row["url"]).path, []).append((row["outcome"], row["error"]))
    return outcomes


def _page(sku: str, links: str = "", cookies: list[bytes] | None = None) -> Answer:
    body = f"<html><body><h1>{sku}</h1>{links}</body></html>"
    return Answer(body, headers=[("Set-Cookie", cookie) for cookie in cookies or []])


def test_a_cookie_with_a_non_ascii_value_is_kept_sent_back_as_received_and_the_page_recorded(
    redis_conn: Redis, settings: Settings
) -> None:
    """A cookie's bytes beyond ASCII (UTF-8 or Latin-1) are kept and sent back byte for byte, as
    browsers do; malformed Set-Cookie headers beside them are ignored; the page is parsed."""
    set_cookies = [
        "pref=café; Path=/".encode(),  # UTF-8
        "region=München; Path=/".encode("latin-1"),  # Latin-1: not UTF-8
        b"bad=1; Expires=Sat, 99 Zzz 99999 99:99:99; Max-Age=1e9; Domain=",  # unreadable attributes: ignored
        b"=",
        b";;;",
        b"a=" + b"\xff" * 5000,  # too large
    ]
    routes = Routes({"/": _page("home", '<a href="/next">next</a>', set_cookies), "/next": _page("next")})
    _crawl_jarred(redis_conn, settings, routes)
    assert set(items_by_key(settings.database_url, "jarred")) == {"home", "next"}
    assert [outcome for outcome, _ in _outcomes(settings.database_url, "jarred")["/"]] == ["ok"]
    assert routes.cookies_to("/next") == {"pref=café".encode(), "region=München".encode("latin-1"), b"bad=1"}
    assert Jar(redis_conn, "jarred").names() == ["bad", "pref", "region"]


def test_no_set_cookie_however_malformed_raises_and_the_good_ones_beside_it_are_kept(fake_redis: Redis) -> None:
    malformed = [
        "", " ", "=", ";", "; Path=/", "=; Domain=a.test", "x=\x00y", "x=1\r\nInjected: 1", "x=1; Domain=.",
        "x=1; Max-Age=" + "9" * 1000, "x=1; Expires=" + "Mon, 01 Jan 99999999 00:00:00 GMT",
        "x=1; Expires=\ud800", "caf\u00e9\u2603=\U0001f36a", "x=1; Domain=\u2603.test", "x=1; Path=" + "/a" * 600,
        "x=1; Domain=[::1]", "x=1; Domain=" + "a." * 600 + "test",
    ]  # fmt: skip
    jar = Jar(fake_redis, "s")
    jar.update("http://a.test/dir/page", [*malformed, "good=1; Path=/"])
    jar.update("http://[::1]:8080/", ["v6=1", "x=1; Domain=::1"])
    jar.update("not a url", ["x=1"])
    assert "good=1" in jar.header("http://a.test/")["cookie"]
    assert "v6=1" in jar.header("http://[::1]:8080/")["cookie"]
    assert jar.header("http://[::1") == {}  # a URL that does not parse has no cookies (its fetch is refused)
    # The cookie beyond Latin-1 (given as text, not bytes) is kept as its UTF-8 bytes.
    assert "caf\u00e9\u2603=\U0001f36a".encode().decode("latin-1") in jar.header("http://a.test/dir/")["cookie"]
    # Max-Age past 400 days, a Path over 1024 bytes ignored (the default path), the huge date: all capped.
    expiries = [json.loads(v)["expires"] for v in fake_redis.hvals(keys.cookies("s"))]
    assert all(e is None or e <= time.time() + MAX_COOKIE_AGE + 5 for e in expiries)


def test_a_site_s_jar_keeps_180_cookies_a_domain_the_newest_and_sends_no_more(
    redis_conn: Redis, settings: Settings
) -> None:
    """A page setting 250 cookies leaves the jar with the newest MAX_COOKIES_PER_DOMAIN, as
    Chromium keeps them, and the next request sends those alone."""
    names = [f"c{i * 7919 % 1000:03d}" for i in range(250)]  # in an order that is not the names'
    many = [f"{name}=v; Path=/".encode() for name in names]
    routes = Routes({"/": _page("home", '<a href="/next">next</a>', many), "/next": _page("next")})
    _crawl_jarred(redis_conn, settings, routes)
    kept = set(names[250 - MAX_COOKIES_PER_DOMAIN :])
    assert set(Jar(redis_conn, "jarred").names()) == kept
    assert {cookie.split(b"=")[0].decode() for cookie in routes.cookies_to("/next")} == kept
    assert set(items_by_key(settings.database_url, "jarred")) == {"home", "next"}


@pytest.mark.slow
def test_the_jar_keeps_3300_cookies_in_all_and_a_cookie_up_to_4096_bytes_evicting_the_oldest(
    fake_redis: Redis,
) -> None:
    jar = Jar(fake_redis, "s")
    # Subdomains of one registrable domain count together.
    jar.update("http://a.example.co.uk/", [f"a{i:03d}=1" for i in range(100)])
    jar.update("http://b.example.co.uk/", [f"b{i:03d}=1" for i in range(100)])
    assert len(jar.names()) == MAX_COOKIES_PER_DOMAIN and "a019" not in jar.names() and "a020" in jar.names()
    fake_redis.delete(keys.cookies("s"))
    domains = MAX_COOKIES // MAX_COOKIES_PER_DOMAIN + 1  # 19 domains of 180: 3420 cookies
    for d in range(domains):
        jar.update(f"http://site{d}.test/", [f"d{d:02d}c{i:03d}=1" for i in range(MAX_COOKIES_PER_DOMAIN)])
    names = jar.names()
    assert len(names) == MAX_COOKIES == fake_redis.hlen(keys.cookies("s"))
    overflow = domains * MAX_COOKIES_PER_DOMAIN - MAX_COOKIES  # the oldest: the first domain's first 120
    assert "d00c119" not in names and "d00c120" in names and f"d{domains - 1:02d}c179" in names
    assert overflow == 120
    # Size: a name and value of 4096 bytes kept, of 4097 refused (not cut); a replaced cookie keeps its age.
    fake_redis.delete(keys.cookies("s"))
    jar.update("http://a.test/", ["n=" + "v" * (MAX_COOKIE_BYTES - 1), "m=" + "v" * MAX_COOKIE_BYTES])
    assert jar.names() == ["n"]
    created = json.loads(fake_redis.hvals(keys.cookies("s"))[0])["created"]
    jar.update("http://a.test/", ["n=2"])
    assert json.loads(fake_redis.hvals(keys.cookies("s"))[0])["created"] == created


def test_cookie_domains_on_public_suffixes_or_parts_of_an_ip_address_are_refused(fake_redis: Redis) -> None:
    jar = Jar(fake_redis, "s")
    jar.update(
        "http://shop.example.co.uk/",
        ["suffix=1; Domain=.co.uk", "tld=1; Domain=uk", "ok=1; Domain=example.co.uk", "host=1"],
    )
    jar.update("http://a.com/", ["com=1; Domain=com", "self=1; Domain=a.com"])
    jar.update("http://user.github.io/", ["private=1; Domain=github.io"])  # the list's private section too
    jar.update("http://localhost/", ["local=1; Domain=localhost"])  # the host itself: host-only
    assert jar.names() == ["host", "local", "ok", "self"]
    assert jar.header("http://other.co.uk/") == {} and jar.header("http://b.com/") == {}
    assert jar.header("http://www.example.co.uk/") == {"cookie": "ok=1"}  # host=1 is shop's alone
    assert jar.header("http://localhost/") == {"cookie": "local=1"}
    assert jar.header("http://sub.localhost/") == {}


def test_a_cookie_on_an_ip_host_is_kept_for_that_address_alone(redis_conn: Redis, settings: Settings) -> None:
    """On a real crawl of 127.0.0.1: ``Domain=.0.1`` is refused, ``Domain=127.0.0.1`` is the
    host itself (host-only), and neither goes to 127.0.0.2."""
    set_cookies = [b"wide=1; Domain=.0.1", b"part=1; Domain=0.0.1", b"exact=1; Domain=127.0.0.1", b"host=1"]
    routes = Routes({"/": _page("home", '<a href="/next">next</a>', set_cookies), "/next": _page("next")})
    _crawl_jarred(redis_conn, settings, routes)
    assert routes.cookies_to("/next") == {b"exact=1", b"host=1"}
    jar = Jar(redis_conn, "jarred")
    assert jar.names() == ["exact", "host"]
    assert jar.header("http://127.0.0.2/") == {}


def test_a_cookie_without_equals_has_an_empty_name_and_its_value_is_never_shown(
    fake_redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """RFC 6265bis and browsers: ``Set-Cookie: token`` is a cookie with an empty name whose value is
    ``token``; it is sent back as ``token`` alone, and shown redacted."""
    secret = "sessiontoken-" + secrets.token_hex(8)
    assert redacted_set_cookie(secret) == "(redacted)"
    assert redacted_set_cookie(f"{secret}; Path=/; HttpOnly") == "(redacted); Path=/; HttpOnly"
    assert redacted_set_cookie("sid=abc; Path=/") == "sid=(redacted); Path=/"
    assert redacted_set_cookie("caf\u00e9=x".encode().decode("latin-1")) == "caf\u00e9=(redacted)"
    jar = Jar(fake_redis, "s")
    with caplog.at_level(logging.DEBUG, logger="crawler.session"):
        jar.update("http://a.test/", [secret, f"{secret}-refused; Domain=com", "=\x00" + secret])
    assert jar.names() == [""]
    assert jar.header("http://a.test/") == {"cookie": secret}
    jar.update("http://a.test/", ["other"])  # one name (the empty one): the second replaces the first
    assert jar.header("http://a.test/") == {"cookie": "other"}
    assert "cookie refused" in caplog.text and secret not in caplog.text
    assert all(secret not in field.decode() for field in fake_redis.hkeys(keys.cookies("s")))


def test_the_fetch_command_shows_a_cookie_without_equals_redacted(
    redis_url: str, sqlite_url: str, tmp_path: Path
) -> None:
    secret = "sessiontoken-" + secrets.token_hex(8)
    routes = Routes({"/": _page("home", cookies=[f"{secret}; Path=/".encode()])})
    with serving_routes(routes) as url:
        _write_spider(tmp_path / "sites", JAR_SPIDER.format(url=url))
        fetched = _run(_cli(redis_url, sqlite_url, tmp_path / "sites", "fetch", f"{url}/", "--headers"))
    assert fetched.returncode == 0, fetched.stderr
    assert "set-cookie: (redacted); Path=/" in fetched.stdout
    assert secret not in fetched.stdout + fetched.stderr


def test_a_jar_kept_by_http_cookiejar_is_read(fake_redis: Redis) -> None:
    """A jar written before these rules (``http.cookiejar``'s fields) is still read: its cookies sent,
    a cookie it kept without a name given its empty name back."""
    old = {"version": 0, "port": None, "port_specified": False, "domain_specified": False,
           "domain_initial_dot": False, "path_specified": True, "secure": False, "expires": None,
           "discard": True, "comment": None, "comment_url": None, "rfc2109": False,
           "rest": {"HttpOnly": None}}  # fmt: skip
    fake_redis.hset(
        keys.cookies("s"),
        mapping={
            '["a.test", "/", "sid"]': json.dumps({**old, "name": "sid", "value": "1", "domain": "a.test", "path": "/"}),
            '["a.test", "/", "tok"]': json.dumps(
                {**old, "name": "tok", "value": None, "domain": "a.test", "path": "/"}
            ),
            '["a.test", "/", "junk"]': "{not json",
            b"\xff": b"\xff",  # written by hand
        },
    )
    jar = Jar(fake_redis, "s")
    assert sorted(jar.header("http://a.test/")["cookie"].split("; ")) == ["sid=1", "tok"]
    assert jar.names() == ["", "sid"]
    assert sorted(fake_redis.hkeys(keys.cookies("s"))) == [b'["a.test", "/", ""]', b'["a.test", "/", "sid"]']


OUTAGE_SPIDER = """
    from crawler import Spider

    class Members(Spider):
        name = "members"
        start_urls = ["{url}/"]
        interval = 0.01
        obey_robots = False
        item_key = "sku"
        login_url = "{url}/login"

        def login(self, page):
            return page.form("form#login", data={{"user": "alice"}})

        def logged_out(self, page):
            if page.url.endswith("/status"):
                return page.json()["logged_out"]  # the site's JSON answer; in maintenance, it sends HTML
            return page.css_first("form#login") is not None

        def parse(self, page):
            yield {{"sku": page.text("h1")}}
            yield from page.follow_all("a")
"""


def test_a_logged_out_that_raises_fails_its_page_with_the_traceback_and_the_crawl_goes_on(
    redis_conn: Redis, settings: Settings
) -> None:
    form = '<form id="login" method="post" action="/do-login"><input name="user"></form>'
    links = "".join(f'<a href="{path}">{path}</a>' for path in ("/p/1", "/status", "/p/2"))
    routes = Routes(
        {
            "/login": Answer(f"<html><body>{form}</body></html>"),
            "/do-login": Answer("<html><body>welcome</body></html>", headers=[("Set-Cookie", b"sid=1; Path=/")]),
            "/": _page("home", links),
            "/p/1": _page("p1"),
            "/p/2": _page("p2"),
            "/status": _page("Down for maintenance"),
        }
    )
    with serving_routes(routes) as url:
        _write_spider(Path(settings.sites_dir), OUTAGE_SPIDER.format(url=url))
        with installed_runtime(redis_conn, settings) as rt:
            seed(rt.frontier("members"), [f"{url}/"])
            run_in_threads(rt, sites=("members",), timeout=30)
    assert set(items_by_key(settings.database_url, "members")) == {"home", "p1", "p2"}
    [(outcome, error)] = _outcomes(settings.database_url, "members")["/status"]
    assert outcome == "failed" and error is not None
    assert error.startswith("logged_out raised: Traceback") and 'page.json()["logged_out"]' in error
    assert "JSONDecodeError" in error.splitlines()[-1]
    store = Store(settings.database_url)
    try:  # listed by `crawler failed`, for `crawler retry`
        assert [urlsplit(page.url).path for page in failed_pages(store, "members")] == ["/status"]
    finally:
        store.close()
