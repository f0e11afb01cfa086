"""Only push services are reachable (invariant 13): the endpoint policy, at subscribe and at connect.

A subscription's endpoint comes from any browser on the internet, and the runner POSTs to
it: without a check, it is a way into the operator's network (SSRF). The policy:

* ``https`` on port 443, to a host whose **every** resolved address is public: no
  loopback, private, link-local (cloud metadata), CGNAT, multicast, unspecified,
  reserved, benchmarking or documentation address, nor an IPv4-mapped, IPv4-compatible,
  6to4 or NAT64 form of one; no site-local or unique-local IPv6. An IP literal must be
  written canonically (``0x7f000001``, ``2130706433``, ``0177.0.0.1`` and ``127.1`` are
  refused: resolvers read them as addresses, readers do not).
* Optionally only hosts under listed push-service suffixes (``GOV_PUSH_HOSTS``, e.g.
  ``fcm.googleapis.com,push.services.mozilla.com,web.push.apple.com,notify.windows.com``;
  empty means any public host).
* Test mode (``GOV_ALLOW_LOOPBACK_HTTP=1`` or ``allow_loopback_http=True``) also admits
  ``http`` or ``https`` on any port to a loopback host (``localhost``, 127.0.0.0/8,
  ``::1``), and nothing else.

It is checked when a subscription is stored (:meth:`EndpointGuard.check_url`, from
:func:`gov.delivery.subscription.parse_subscription` and :meth:`gov.Governor.subscribe`), and again
by the runner at connect time: its :class:`gov.delivery.pushclient.PushClient` opens each new
connection to an address :meth:`EndpointGuard.addresses` returned (the host resolved
once, every address checked), and :func:`guarded_session` gives a ``requests`` session
whose connections do the same; TLS (SNI and the certificate) is still verified against
the host name. A DNS answer that changes between the check and the connect (DNS rebinding) cannot
redirect the runner; the session also ignores proxy settings from the environment, which
would otherwise be the address checked.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError
from urllib3.util import connection

from gov.errors import ConfigurationError, InvalidSubscription

log = logging.getLogger("gov.delivery.netguard")

ENV_ALLOW_LOOPBACK_HTTP = "GOV_ALLOW_LOOPBACK_HTTP"  # tests only: also admit loopback, any port, http
ENV_PUSH_HOSTS = "GOV_PUSH_HOSTS"  # comma-separated host suffixes; empty: any public host
PUSH_PORT = 443
#: The big browser push services, for ``GOV_PUSH_HOSTS`` (Chrome/Edge-Chromium, Firefox, Safari, Windows).
KNOWN_PUSH_HOSTS = ("fcm.googleapis.com", "push.services.mozilla.com", "web.push.apple.com", "notify.windows.com")
DEFAULT_CACHE_S = 30.0  # seconds a resolution is reused by the runner (each use is checked again)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_PRIVATE = "a private address"
_DOCUMENTATION = "a documentation address"
_BENCHMARKING = "a benchmarking address"
_RESERVED = "a reserved address"
# Explicit tables, not only ipaddress's is_global: its lists changed between Python
# patch releases, and each refusal should say what the address is.
_V4: list[tuple[ipaddress.IPv4Network, str]] = [
    (ipaddress.IPv4Network(net), kind)
    for net, kind in [
        ("0.0.0.0/8", "an unspecified ('this network') address"),
        ("10.0.0.0/8", _PRIVATE),
        ("100.64.0.0/10", "a shared (CGNAT) address"),
        ("127.0.0.0/8", "a loopback address"),
        ("169.254.169.254/32", "a link-local address (cloud metadata)"),
        ("169.254.0.0/16", "a link-local address"),
        ("172.16.0.0/12", _PRIVATE),
        ("192.0.0.0/24", "a reserved (IETF protocol) address"),
        ("192.0.2.0/24", _DOCUMENTATION),
        ("192.31.196.0/24", "a reserved (AS112) address"),
        ("192.52.193.0/24", "a reserved (AMT) address"),
        ("192.88.99.0/24", "a reserved (6to4 relay) address"),
        ("192.168.0.0/16", _PRIVATE),
        ("192.175.48.0/24", "a reserved (AS112) address"),
        ("198.18.0.0/15", _BENCHMARKING),
        ("198.51.100.0/24", _DOCUMENTATION),
        ("203.0.113.0/24", _DOCUMENTATION),
        ("224.0.0.0/4", "a multicast address"),
        ("255.255.255.255/32", "a broadcast address"),
        ("240.0.0.0/4", _RESERVED),
    ]
]
_V6: list[tuple[ipaddress.IPv6Network, str]] = [
    (ipaddress.IPv6Network(net), kind)
    for net, kind in [
        ("::/128", "an unspecified address"),
        ("::1/128", "a loopback address"),
        ("64:ff9b:1::/48", "a local-use NAT64 address"),
        ("100::/64", "a discard-only address"),
        ("2001::/32", "a Teredo address"),
        ("2001:2::/48", _BENCHMARKING),
        ("2001:db8::/32", _DOCUMENTATION),
        ("2001::/23", "a reserved (IETF protocol) address"),
        ("3fff::/20", _DOCUMENTATION),
        ("5f00::/16", "a reserved (SRv6 SID) address"),
        ("fd00:ec2::254/128", "a unique local address (cloud metadata)"),
        ("fc00::/7", "a unique local (private) address"),
        ("fe80::/10", "a link-local address"),
        ("fec0::/10", "a site-local address"),
        ("ff00::/8", "a multicast address"),
    ]
]
_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
_COMPATIBLE = ipaddress.IPv6Network("::/96")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SIX_TO_FOUR = ipaddress.IPv6Network("2002::/16")
_HOST_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)")
_NUMERIC_LABEL = re.compile(r"[0-9]+|0x[0-9a-f]*")


class EndpointRefused(InvalidSubscription):
    """An endpoint the policy refuses; ``reason`` says why, ``str()`` is one line for the user."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"endpoint: {reason}")
        self.reason = reason


class RefusedEndpoint(requests.exceptions.RequestException):
    """Raised by a :func:`guarded_session` instead of connecting: the request is never sent.

    A plain :class:`requests.RequestException` (not a ``ConnectionError``): nothing about
    it is transient, so a runner ends the row rather than retrying it.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(f"endpoint refused: {reason}")
        self.reason = reason


# ---------------------------------------------------------------- addresses


def address_problem(address: IPAddress) -> str | None:
    """Why ``address`` is not a public unicast address (e.g. ``"a private address"``), or ``None``."""
    if isinstance(address, ipaddress.IPv6Address):
        bare = ipaddress.IPv6Address(int(address))  # without a %scope, for the table lookups
        if bare in _MAPPED:
            # never a push service's address: it only exists inside a dual-stack socket API
            inner = ipaddress.IPv4Address(int(bare) & 0xFFFFFFFF)
            return f"an IPv4-mapped form of {inner}{_of(inner)}"
        if bare in _COMPATIBLE and int(bare) > 1:
            inner = ipaddress.IPv4Address(int(bare) & 0xFFFFFFFF)
            return f"an IPv4-compatible (deprecated) form of {inner}{_of(inner)}"
        if bare in _NAT64:
            inner = ipaddress.IPv4Address(int(bare) & 0xFFFFFFFF)
            problem = address_problem(inner)
            return f"a NAT64 form of {inner}, {problem}" if problem else None
        if bare in _SIX_TO_FOUR:
            inner = ipaddress.IPv4Address((int(bare) >> 80) & 0xFFFFFFFF)
            problem = address_problem(inner)
            return f"a 6to4 form of {inner}, {problem}" if problem else None
        for net6, kind in _V6:
            if bare in net6:
                return kind
        address = bare
    else:
        for net4, kind in _V4:
            if address in net4:
                return kind
    # what the tables do not name, ipaddress may know (new registry entries)
    if address.is_multicast:
        return "a multicast address"
    if address.is_reserved or address.is_private or not address.is_global:
        return "not a public address"
    return None


def _of(inner: ipaddress.IPv4Address) -> str:
    problem = address_problem(inner)
    return f", {problem}" if problem else ""


def is_loopback_address(address: IPAddress) -> bool:
    """127.0.0.0/8 or ``::1``: what test mode admits (mapped and other forms excluded)."""
    if isinstance(address, ipaddress.IPv6Address):
        return address.scope_id is None and address == ipaddress.IPv6Address("::1")
    return address.is_loopback


def is_loopback_name(host: str) -> bool:
    """``localhost`` and names under it (RFC 6761), with or without a final dot."""
    host = host.lower().rstrip(".")
    return host == "localhost" or host.endswith(".localhost")


def parse_host(host: str) -> IPAddress | str:
    """An IP literal as an address, or a host name (lower case, final dot removed).

    Raises :class:`EndpointRefused` for what a resolver would read as an IPv4 address
    but is not written as one (``0x7f000001``, ``2130706433``, ``0177.0.0.1``, ``127.1``)
    and for names that are not host names.
    """
    bare = host.strip("[]").lower()
    try:
        return ipaddress.ip_address(bare)
    except ValueError:
        pass
    name = bare[:-1] if bare.endswith(".") else bare
    try:
        return ipaddress.IPv4Address(name)  # "10.0.0.5." is 10.0.0.5
    except ValueError:
        pass
    labels = name.split(".")
    if labels and _NUMERIC_LABEL.fullmatch(labels[-1]):
        # a final numeric label makes the whole host an IPv4 address to URL parsers and
        # inet_aton(); only the canonical dotted-quad form is accepted
        try:
            packed = socket.inet_aton(name)
        except OSError:
            raise EndpointRefused(f"{host} is not a valid IPv4 address") from None
        meant = ipaddress.IPv4Address(packed)
        raise EndpointRefused(f"{host} is a non-canonical form of the IPv4 address {meant}")
    if len(name) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels):
        raise EndpointRefused(f"{host[:64]} is not a valid host name")
    return name


# ---------------------------------------------------------------- configuration


def parse_push_hosts(text: str | None) -> tuple[str, ...]:
    """The host suffixes of ``GOV_PUSH_HOSTS`` (comma-separated), normalised; empty: no list."""
    suffixes: list[str] = []
    for item in (text or "").split(","):
        suffix = item.strip().lower().strip(".")
        if not suffix:
            continue
        labels = suffix.split(".")
        if not all(_HOST_LABEL.fullmatch(label) for label in labels):
            raise ValueError(f"{ENV_PUSH_HOSTS}: {item.strip()[:64]!r} is not a host name suffix")
        suffixes.append(suffix)
    return tuple(dict.fromkeys(suffixes))


def _env_flag(environ: Mapping[str, str]) -> bool:
    return environ.get(ENV_ALLOW_LOOPBACK_HTTP) == "1"


class EndpointGuard:
    """The endpoint policy: one instance per runner (it caches resolutions), safe across threads.

    ``allow_loopback`` is test mode. ``allow_hosts`` lists push-service host suffixes (a
    host matches a suffix equal to it or ending in ``.suffix``); empty admits any public
    host. ``cache_s`` keeps a host's resolution that long; every use is checked again.
    """

    def __init__(
        self, allow_loopback: bool = False, allow_hosts: Iterable[str] = (), *, cache_s: float = DEFAULT_CACHE_S
    ) -> None:
        self.allow_loopback = bool(allow_loopback)
        self.allow_hosts = parse_push_hosts(allow_hosts if isinstance(allow_hosts, str) else ",".join(allow_hosts))
        self.cache_s = cache_s
        self._cache: dict[tuple[str, int], tuple[float, list[str]]] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_env(
        cls, allow_loopback: bool | None = None, environ: Mapping[str, str] | None = None, **kwargs: Any
    ) -> EndpointGuard:
        """Test mode from ``GOV_ALLOW_LOOPBACK_HTTP`` unless given; the allowlist from ``GOV_PUSH_HOSTS``."""
        env = os.environ if environ is None else environ
        if allow_loopback is None:
            allow_loopback = _env_flag(env)
        try:
            hosts = parse_push_hosts(env.get(ENV_PUSH_HOSTS))
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
        return cls(allow_loopback, hosts, **kwargs)

    # ------------------------------------------------------------ the whole URL

    def check_url(self, url: str, *, resolve: bool = True) -> None:
        """Refuse ``url`` (raise :class:`EndpointRefused`) unless it is a push service's.

        The strict form, for storing a subscription and before sending: ``http`` and
        ports other than 443 only to a loopback literal or ``localhost`` in test mode.
        With ``resolve``, a host name is resolved and every address checked; a name that
        does not resolve is not refused here (connecting to it will fail, and check again).
        """
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            raise EndpointRefused("not a valid URL (or an invalid port)") from None
        scheme = parts.scheme.lower()
        if scheme not in ("https", "http"):
            raise EndpointRefused(f"must use https:// (got {scheme[:16] or 'no'} scheme)")
        if not parts.hostname:
            raise EndpointRefused("has no host")
        if port is None:
            port = PUSH_PORT if scheme == "https" else 80
        target = parse_host(parts.hostname)
        loopback = is_loopback_name(target) if isinstance(target, str) else is_loopback_address(target)
        if scheme == "http":
            if not self.allow_loopback:
                raise EndpointRefused("must use https://")
            if not loopback:
                raise EndpointRefused("http:// is allowed only on a loopback host (test mode)")
        self._check_target(parts.hostname, target)
        if port != PUSH_PORT and not (self.allow_loopback and loopback):
            raise EndpointRefused(f"port {port} refused: push services are reached on port {PUSH_PORT}")
        if resolve and isinstance(target, str):
            with contextlib.suppress(socket.gaierror):  # nothing to check; connecting will fail
                self.addresses(scheme, target, port)

    # ------------------------------------------------------------ one connection

    def addresses(self, scheme: str, host: str, port: int) -> list[str]:
        """The addresses to connect to for ``host``, every one checked; raise :class:`EndpointRefused`.

        ``socket.gaierror`` when the name does not resolve. This is what a guarded
        connection calls: the addresses it returns are the ones the socket may use.
        """
        scheme = scheme.lower()
        if scheme != "https" and not self.allow_loopback:
            raise EndpointRefused("must use https://")
        target = parse_host(host)
        self._check_target(host, target)
        if port != PUSH_PORT and not self.allow_loopback:
            # only test mode's loopback could justify it; refused before any lookup
            raise EndpointRefused(f"port {port} refused: push services are reached on port {PUSH_PORT}")
        ips = self._resolve(target, port) if isinstance(target, str) else [str(target)]
        parsed = [ipaddress.ip_address(ip) for ip in ips]
        for ip in parsed:
            if self.allow_loopback and is_loopback_address(ip):
                continue
            problem = address_problem(ip)
            if problem is not None:
                where = f"{host} resolves to {ip}, " if isinstance(target, str) else f"{ip} is "
                raise EndpointRefused(f"{where}{problem}")
        if (scheme != "https" or port != PUSH_PORT) and not all(is_loopback_address(ip) for ip in parsed):
            # test mode: http and other ports only when every address is loopback
            if scheme != "https":
                raise EndpointRefused(f"http:// is allowed only to a loopback host (test mode); {host} is not one")
            raise EndpointRefused(f"port {port} refused: push services are reached on port {PUSH_PORT}")
        return ips

    def _check_target(self, host: str, target: IPAddress | str) -> None:
        if isinstance(target, str):
            if is_loopback_name(target) and not self.allow_loopback:
                raise EndpointRefused(f"{target} is a loopback host")
        else:
            problem = address_problem(target)
            if problem is not None and not (self.allow_loopback and is_loopback_address(target)):
                raise EndpointRefused(f"{str(target) if _canonical(host, target) else host} is {problem}")
        if self.allow_hosts and not (self.allow_loopback and _is_loopback_target(target)):
            name = target if isinstance(target, str) else ""
            if not any(name == s or name.endswith("." + s) for s in self.allow_hosts):
                raise EndpointRefused(f"{str(target)[:64]} is not a listed push service ({ENV_PUSH_HOSTS})")

    def _resolve(self, host: str, port: int) -> list[str]:
        key = (host, port)
        now = time.monotonic()
        if self.cache_s > 0:
            with self._lock:
                hit = self._cache.get(key)
            if hit is not None and hit[0] > now:
                return list(hit[1])
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
        ips = list(dict.fromkeys(str(info[4][0]) for info in infos))
        if not ips:
            raise socket.gaierror(socket.EAI_NONAME, "no address")
        if self.cache_s > 0:
            with self._lock:
                self._cache[key] = (now + self.cache_s, ips)
        return list(ips)


def _canonical(host: str, target: IPAddress) -> bool:
    return host.strip("[]").lower().rstrip(".") == str(target)


def _is_loopback_target(target: IPAddress | str) -> bool:
    return is_loopback_name(target) if isinstance(target, str) else is_loopback_address(target)


# ---------------------------------------------------------------- the requests side


class _GuardedConnectionMixin:
    """``_new_conn`` of urllib3's connections, through the guard: resolve once, check, connect there."""

    guard: EndpointGuard
    scheme_name: str
    # provided by urllib3's HTTPConnection
    _dns_host: str
    host: str
    port: int
    timeout: Any
    source_address: Any
    socket_options: Any

    def _new_conn(self) -> socket.socket:
        try:
            addresses = self.guard.addresses(self.scheme_name, self._dns_host, self.port)
        except socket.gaierror as exc:
            raise NameResolutionError(self.host, self, exc) from exc  # type: ignore[arg-type]
        # EndpointRefused is not an OSError: urllib3 lets it through, the adapter turns it
        # into RefusedEndpoint. Every address below has been checked.
        error: Exception | None = None
        for address in addresses:
            try:
                sock = connection.create_connection(
                    (address, self.port),
                    self.timeout,
                    source_address=self.source_address,
                    socket_options=self.socket_options,
                )
            except TimeoutError as exc:
                error = ConnectTimeoutError(
                    self, f"Connection to {self.host} ({address}) timed out. (connect timeout={self.timeout})"
                )
                error.__cause__ = exc
            except OSError as exc:
                error = NewConnectionError(self, f"Failed to establish a new connection: {exc}")  # type: ignore[arg-type]
                error.__cause__ = exc
            else:
                sys.audit("http.client.connect", self, self.host, self.port)
                return sock
        assert error is not None  # addresses is never empty
        raise error


class _GuardedHTTPConnection(_GuardedConnectionMixin, HTTPConnection):
    scheme_name = "http"


class _GuardedHTTPSConnection(_GuardedConnectionMixin, HTTPSConnection):
    # TLS wraps the socket with server_hostname = self.host: SNI and the certificate
    # check are against the name, whatever address the socket went to.
    scheme_name = "https"


class GuardedAdapter(HTTPAdapter):
    """A ``requests`` transport whose every new connection goes through ``guard``.

    Proxies are never used (the proxy's address would be the one checked).
    """

    def __init__(self, guard: EndpointGuard, **kwargs: Any) -> None:
        self.guard = guard
        super().__init__(**kwargs)

    def init_poolmanager(self, connections: int, maxsize: int, block: bool = False, **pool_kwargs: Any) -> None:
        super().init_poolmanager(connections, maxsize, block, **pool_kwargs)
        guard = self.guard
        http_conn = type("GuardedHTTPConnection", (_GuardedHTTPConnection,), {"guard": guard})
        https_conn = type("GuardedHTTPSConnection", (_GuardedHTTPSConnection,), {"guard": guard})
        self.poolmanager.pool_classes_by_scheme = {
            "http": type("GuardedHTTPConnectionPool", (HTTPConnectionPool,), {"ConnectionCls": http_conn}),
            "https": type("GuardedHTTPSConnectionPool", (HTTPSConnectionPool,), {"ConnectionCls": https_conn}),
        }

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        raise RefusedEndpoint("a proxy was configured; the runner connects to push services directly")

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> requests.Response:
        kwargs["proxies"] = None
        if len(args) >= 5:  # (stream, timeout, verify, cert, proxies) passed by position
            args = args[:4]
        try:
            return super().send(request, *args, **kwargs)
        except EndpointRefused as exc:
            log.warning("endpoint refused: %s", exc.reason, extra={"action": "endpoint_refused"})
            raise RefusedEndpoint(exc.reason) from None


def guarded_session(
    allow_loopback: bool = False, allow_hosts: Iterable[str] | None = None, *, guard: EndpointGuard | None = None
) -> requests.Session:
    """A ``requests.Session`` that reaches only what the policy admits (see the module doc).

    ``allow_hosts`` ``None`` reads ``GOV_PUSH_HOSTS``. Give ``guard`` to share one guard
    (and its resolution cache) between the sessions of several threads.
    """
    if guard is None:
        if allow_hosts is None:
            guard = EndpointGuard.from_env(allow_loopback)
        else:
            guard = EndpointGuard(allow_loopback, allow_hosts)
    session = requests.Session()
    session.trust_env = False  # no proxies, netrc or CA bundle overrides from the environment
    session.proxies = {}
    adapter = GuardedAdapter(guard)
    session.mount("https://", adapter)
    session.mount("http://", adapter)
    return session
