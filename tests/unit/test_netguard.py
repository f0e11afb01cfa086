"""Only push services are reachable (invariant 13): the endpoint policy, at subscribe and at connect.

Every hostile form is tried against the real guard: its address check, the subscription
parser, and a guarded ``requests`` session making a real request. Only the resolver is
replaced (``socket.getaddrinfo`` for made-up names), to play DNS answers an attacker
controls; the TLS test connects to a real server on 127.0.0.1 through it.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
import urllib3.util.connection
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gov.delivery.netguard import (
    EndpointGuard,
    EndpointRefused,
    RefusedEndpoint,
    address_problem,
    guarded_session,
    parse_push_hosts,
)
from gov.delivery.subscription import b64url_encode, parse_subscription
from gov.errors import InvalidSubscription
from gov.testing import PushService

POINT = ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
    serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
)
KEYS = {"p256dh": b64url_encode(POINT), "auth": b64url_encode(b"\x01" * 16)}

# (endpoint, a word the refusal must contain): refused outside test mode, before any DNS.
HOSTILE = [
    ("https://10.0.0.5/x", "private"),
    ("https://10.255.255.255/x", "private"),
    ("https://172.16.0.1/x", "private"),
    ("https://192.168.1.20/x", "private"),
    ("https://169.254.169.254/latest/meta-data/", "link-local"),
    ("https://127.0.0.1/x", "loopback"),
    ("https://127.0.0.1:8443/x", "loopback"),
    ("https://127.8.9.10/x", "loopback"),
    ("https://[::1]/x", "loopback"),
    ("https://[::1]:8443/x", "loopback"),
    ("https://0.0.0.0/x", "unspecified"),
    ("https://0.1.2.3/x", "unspecified"),
    ("https://[::]/x", "unspecified"),
    ("https://100.64.0.1/x", "CGNAT"),
    ("https://100.127.255.254/x", "CGNAT"),
    ("https://224.0.0.1/x", "multicast"),
    ("https://239.255.255.250/x", "multicast"),
    ("https://240.0.0.1/x", "reserved"),
    ("https://255.255.255.255/x", "broadcast"),
    ("https://192.0.0.8/x", "reserved"),
    ("https://198.18.0.1/x", "benchmarking"),
    ("https://198.19.255.1/x", "benchmarking"),
    ("https://192.0.2.1/x", "documentation"),
    ("https://198.51.100.7/x", "documentation"),
    ("https://203.0.113.9/x", "documentation"),
    ("https://[::ffff:127.0.0.1]/x", "IPv4-mapped"),
    ("https://[::ffff:7f00:1]/x", "IPv4-mapped"),
    ("https://[::ffff:10.0.0.5]/x", "IPv4-mapped"),
    ("https://[::ffff:169.254.169.254]/x", "IPv4-mapped"),
    ("https://[::127.0.0.1]/x", "IPv4-compatible"),
    ("https://[::10.0.0.5]/x", "IPv4-compatible"),
    ("https://[2002:7f00:1::]/x", "6to4"),
    ("https://[2002:a9fe:a9fe::1]/x", "6to4"),
    ("https://[64:ff9b::a00:5]/x", "NAT64"),
    ("https://[64:ff9b::7f00:1]/x", "NAT64"),
    ("https://[64:ff9b:1::1]/x", "NAT64"),
    ("https://[fe80::1]/x", "link-local"),
    ("https://[fe80::1%25eth0]/x", "link-local"),
    ("https://[fec0::1]/x", "site-local"),
    ("https://[fc00::1]/x", "unique local"),
    ("https://[fd00:ec2::254]/x", "unique local"),
    ("https://[ff02::1]/x", "multicast"),
    ("https://[ff0e::1]/x", "multicast"),
    ("https://[2001:db8::1]/x", "documentation"),
    ("https://[2001:2::1]/x", "benchmarking"),
    ("https://[100::1]/x", "discard"),
    ("https://[2001::1]/x", "Teredo"),
    ("https://0x7f000001/x", "non-canonical"),
    ("https://2130706433/x", "non-canonical"),
    ("https://017700000001/x", "non-canonical"),
    ("https://0177.0.0.1/x", "non-canonical"),
    ("https://0x7f.0.0.1/x", "non-canonical"),
    ("https://127.1/x", "non-canonical"),
    ("https://10.1/x", "non-canonical"),
    ("https://167772165/x", "non-canonical"),  # 10.0.0.5
    ("https://010.0.0.5/x", "non-canonical"),  # octal: 8.0.0.5 to inet_aton, 10.0.0.5 to a reader
    ("https://10.0.0.5./x", "private"),
    ("https://256.0.0.1/x", "not a valid IPv4"),
    ("https://localhost/x", "loopback"),
    ("https://LOCALHOST./x", "loopback"),
    ("https://push.localhost/x", "loopback"),
    ("https://push.example.com:8443/x", "443"),
    ("https://push.example.com:80/x", "443"),
    ("https://push.example.com:0/x", "443"),
    ("http://push.example.com/x", "https"),
    ("http://127.0.0.1:8080/x", "https"),
    ("http://10.0.0.5/x", "https"),
]

PUBLIC = [
    "8.8.8.8",
    "1.1.1.1",
    "142.250.185.74",
    "100.63.255.255",  # just below CGNAT
    "100.128.0.1",  # just above it
    "172.32.0.1",  # just above 172.16/12
    "2a00:1450:4001:82b::200a",
    "2606:4700::6810:85e5",
    "64:ff9b::808:808",  # NAT64 of 8.8.8.8: what DNS64 gives an IPv6-only host
]


def _info(endpoint: str) -> dict[str, Any]:
    return {"endpoint": endpoint, "keys": KEYS}


# ---------------------------------------------------------------- addresses


@pytest.mark.parametrize(
    ("address", "word"),
    [
        ("10.0.0.5", "private"),
        ("169.254.169.254", "metadata"),
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("0.0.0.0", "unspecified"),
        ("100.64.0.1", "CGNAT"),
        ("224.0.0.251", "multicast"),
        ("198.18.0.1", "benchmarking"),
        ("::ffff:192.168.0.1", "IPv4-mapped"),
        ("::ffff:8.8.8.8", "IPv4-mapped"),  # refused as a form, even of a public address
        ("fd12:3456::1", "unique local"),
        ("fe80::1%2", "link-local"),
        ("2002:c0a8:1::1", "6to4"),
        ("64:ff9b::c0a8:1", "NAT64"),
    ],
)
def test_address_problem_names_the_kind(address: str, word: str) -> None:
    problem = address_problem(ipaddress.ip_address(address))
    assert problem is not None and word in problem, problem


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_pass(address: str) -> None:
    assert address_problem(ipaddress.ip_address(address)) is None


# ---------------------------------------------------------------- the policy, at subscribe


@pytest.mark.parametrize(("endpoint", "word"), HOSTILE)
def test_hostile_endpoint_refused_by_the_guard(endpoint: str, word: str) -> None:
    with pytest.raises(EndpointRefused) as refused:
        EndpointGuard(allow_loopback=False).check_url(endpoint)
    assert word in str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(("endpoint", "word"), HOSTILE)
def test_hostile_endpoint_refused_when_parsed(endpoint: str, word: str) -> None:
    with pytest.raises(InvalidSubscription) as refused:
        parse_subscription(_info(endpoint))
    message = str(refused.value)
    assert message.startswith("endpoint:") and word in message and "\n" not in message, message


@pytest.mark.parametrize(
    "endpoint",
    [
        "https://fcm.googleapis.com/fcm/send/abc:def",
        "https://updates.push.services.mozilla.com/wpush/v2/gAAA",
        "https://web.push.apple.com/QGuQ",
        "https://wns2-par02p.notify.windows.com/w/?token=x",
        "https://fcm.googleapis.com:443/fcm/send/abc",
        "https://8.8.8.8/x",
        "https://[2a00:1450:4001:82b::200a]/x",
    ],
)
def test_push_services_accepted(endpoint: str) -> None:
    assert parse_subscription(_info(endpoint)).endpoint == endpoint
    EndpointGuard(allow_loopback=False).check_url(endpoint, resolve=False)


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://127.0.0.1:8080/push/x",
        "https://127.0.0.1:8443/push/x",
        "http://[::1]:9000/x",
        "https://[::1]/x",
        "http://localhost:8080/x",
        "https://localhost:9999/x",
    ],
)
def test_test_mode_admits_loopback_on_any_port_and_scheme(endpoint: str) -> None:
    assert parse_subscription(_info(endpoint), allow_loopback_http=True).endpoint == endpoint
    EndpointGuard(allow_loopback=True).check_url(endpoint)
    with pytest.raises(InvalidSubscription):
        parse_subscription(_info(endpoint))


@pytest.mark.parametrize(
    ("endpoint", "word"),
    [
        ("http://10.0.0.5/x", "loopback"),
        ("https://10.0.0.5/x", "private"),
        ("https://169.254.169.254/x", "link-local"),
        ("https://[::ffff:127.0.0.1]/x", "IPv4-mapped"),
        ("https://0x7f000001/x", "non-canonical"),
        ("http://push.example.com/x", "loopback"),
        ("https://push.example.com:8443/x", "443"),
    ],
)
def test_test_mode_admits_nothing_else(endpoint: str, word: str) -> None:
    with pytest.raises(EndpointRefused, match=word):
        EndpointGuard(allow_loopback=True).check_url(endpoint)


# ---------------------------------------------------------------- the allowlist


def test_push_hosts_parsed_from_configuration() -> None:
    assert parse_push_hosts(" FCM.googleapis.com , .push.services.mozilla.com,,") == (
        "fcm.googleapis.com",
        "push.services.mozilla.com",
    )
    assert parse_push_hosts("") == ()
    with pytest.raises(ValueError, match="GOV_PUSH_HOSTS"):
        parse_push_hosts("fcm.googleapis.com,https://evil.example/")


@pytest.mark.parametrize(
    ("endpoint", "allowed"),
    [
        ("https://fcm.googleapis.com/fcm/send/x", True),
        ("https://updates.push.services.mozilla.com/wpush/v2/x", True),
        ("https://wns2-par02p.notify.windows.com/w/?token=x", True),
        ("https://evilfcm.googleapis.com/x", False),  # a suffix matches whole labels only
        ("https://fcm.googleapis.com.evil.example/x", False),
        ("https://push.example.com/x", False),
        ("https://8.8.8.8/x", False),
    ],
)
def test_allowlist_of_push_service_suffixes(endpoint: str, allowed: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOV_PUSH_HOSTS", "fcm.googleapis.com,push.services.mozilla.com,notify.windows.com")
    guard = EndpointGuard.from_env(allow_loopback=False)
    if allowed:
        guard.check_url(endpoint, resolve=False)
        assert parse_subscription(_info(endpoint)).endpoint == endpoint
    else:
        with pytest.raises(EndpointRefused, match="GOV_PUSH_HOSTS"):
            guard.check_url(endpoint, resolve=False)
        with pytest.raises(InvalidSubscription, match="GOV_PUSH_HOSTS"):
            parse_subscription(_info(endpoint))


def test_allowlist_does_not_close_test_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOV_PUSH_HOSTS", "fcm.googleapis.com")
    EndpointGuard.from_env(allow_loopback=True).check_url("http://127.0.0.1:8080/push/x")


# ---------------------------------------------------------------- resolution


class FakeDNS:
    """Answers for made-up names, in order (the last answer repeats); real ones pass through."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, answers: dict[str, list[list[str]]]) -> None:
        self.answers = answers
        self.calls: dict[str, int] = {}
        self._real: Callable[..., Any] = socket.getaddrinfo
        monkeypatch.setattr(socket, "getaddrinfo", self)

    def __call__(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        if name not in self.answers:
            return self._real(host, port, *args, **kwargs)
        n = self.calls[name] = self.calls.get(name, 0) + 1
        addresses = self.answers[name][min(n, len(self.answers[name])) - 1]
        if not addresses:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        port = int(port or 0)
        return [
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", (a, port, 0, 0))
            if ":" in a
            else (socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
            for a in addresses
        ]


@pytest.mark.parametrize(
    ("addresses", "word"),
    [
        (["10.0.0.5"], "private"),
        (["169.254.169.254"], "metadata"),
        (["8.8.8.8", "192.168.0.1"], "private"),  # every address must be public, not just one
        (["2a00:1450:4001:82b::200a", "fd00::1"], "unique local"),
        (["::ffff:127.0.0.1"], "IPv4-mapped"),
    ],
)
def test_name_resolving_to_a_private_address_refused(
    addresses: list[str], word: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    FakeDNS(monkeypatch, {"push.evil.example": [addresses]})
    with pytest.raises(EndpointRefused) as refused:
        EndpointGuard(allow_loopback=False).check_url("https://push.evil.example/x")
    assert word in str(refused.value) and "push.evil.example" in str(refused.value)


def test_localhost_resolves_to_loopback_and_is_refused() -> None:
    # a real name and a real resolution, outside test mode
    with pytest.raises(EndpointRefused, match="loopback"):
        EndpointGuard(allow_loopback=False).addresses("https", "localhost", 443)


def test_name_that_does_not_resolve_is_left_to_connect_time(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeDNS(monkeypatch, {"push.gone.example": [[]]})
    EndpointGuard(allow_loopback=False).check_url("https://push.gone.example/x")  # no refusal: nothing to check
    with pytest.raises(socket.gaierror):
        EndpointGuard(allow_loopback=False).addresses("https", "push.gone.example", 443)


def test_test_mode_name_must_resolve_to_loopback_only_for_http_or_other_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeDNS(monkeypatch, {"both.example": [["127.0.0.1", "8.8.8.8"]], "lo.example": [["127.0.0.1"]]})
    guard = EndpointGuard(allow_loopback=True)
    assert guard.addresses("https", "lo.example", 8443) == ["127.0.0.1"]
    assert guard.addresses("https", "both.example", 443) == ["127.0.0.1", "8.8.8.8"]
    with pytest.raises(EndpointRefused, match="443"):
        guard.addresses("https", "both.example", 8443)
    with pytest.raises(EndpointRefused, match="loopback"):
        guard.addresses("http", "both.example", 80)


# ---------------------------------------------------------------- at connect time


class Connects:
    """Records where sockets would be opened (the network layer under the guard), opens none."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.targets: list[tuple[str, int]] = []
        monkeypatch.setattr(urllib3.util.connection, "create_connection", self)

    def __call__(self, address: tuple[str, int], *args: Any, **kwargs: Any) -> Any:
        self.targets.append(address)
        raise ConnectionRefusedError(111, "Connection refused (recorded by the test)")


# requests sends ":0" to the default port, so that one is the subscribe-time check's alone
SENT = [h for h in HOSTILE if not h[0].startswith("http://") and ":0/" not in h[0]]


@pytest.mark.parametrize(("endpoint", "word"), SENT)
def test_guarded_session_refuses_hostile_endpoints_without_connecting(
    endpoint: str, word: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    connects = Connects(monkeypatch)
    with guarded_session(allow_loopback=False) as session, pytest.raises(RefusedEndpoint) as refused:
        session.post(endpoint, data=b"x", timeout=2)
    assert not isinstance(refused.value, requests.ConnectionError)  # terminal, not retried as transient
    assert str(refused.value).startswith("endpoint refused:") and word in str(refused.value)
    assert connects.targets == []


def test_runner_without_test_mode_never_posts_to_loopback_http(push_service: PushService) -> None:
    endpoint = push_service.subscribe().info["endpoint"]
    with guarded_session(allow_loopback=False) as session, pytest.raises(RefusedEndpoint, match="https"):
        session.post(endpoint, data=b"x", timeout=2)
    assert push_service.received == []
    with guarded_session(allow_loopback=True) as session:
        answer = session.post(endpoint, data=b"x", timeout=2)
    assert answer.status_code == 400  # reached the service (which refuses a body with no headers)
    assert len(push_service.received) == 1


def test_session_ignores_proxies_from_the_environment(
    push_service: PushService, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a proxy would be the address checked instead of the push service's
    monkeypatch.setenv("HTTP_PROXY", "http://10.0.0.5:3128")
    monkeypatch.setenv("HTTPS_PROXY", "http://10.0.0.5:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    with guarded_session(allow_loopback=True) as session:
        session.post(push_service.subscribe().info["endpoint"], data=b"x", timeout=2)
    assert len(push_service.received) == 1


def test_dns_rebinding_connects_to_the_checked_address(monkeypatch: pytest.MonkeyPatch) -> None:
    """First answer public, every later one private: the socket goes to the public address
    the guard checked, and the name is resolved once for the check and the connect together."""
    dns = FakeDNS(monkeypatch, {"push.rebind.example": [["93.184.216.34"], ["10.0.0.5"]]})
    connects = Connects(monkeypatch)
    guard = EndpointGuard(allow_loopback=False, cache_s=0)
    with guarded_session(guard=guard) as session, pytest.raises(requests.ConnectionError):
        session.post("https://push.rebind.example/x", data=b"x", timeout=2)
    assert connects.targets == [("93.184.216.34", 443)]
    assert dns.calls["push.rebind.example"] == 1
    # the next connection resolves again, gets the private answer, and is refused before connecting
    with guarded_session(guard=guard) as session, pytest.raises(RefusedEndpoint, match="private"):
        session.post("https://push.rebind.example/x", data=b"x", timeout=2)
    assert connects.targets == [("93.184.216.34", 443)]
    assert dns.calls["push.rebind.example"] == 2


def test_runner_pre_check_and_connection_share_one_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the cache (the runner's setting), a check before sending and the connection
    after it use the same checked answer: a flip between the two cannot be exploited."""
    dns = FakeDNS(monkeypatch, {"push.rebind.example": [["93.184.216.34"], ["10.0.0.5"]]})
    connects = Connects(monkeypatch)
    guard = EndpointGuard(allow_loopback=False)
    guard.check_url("https://push.rebind.example/x")
    with guarded_session(guard=guard) as session, pytest.raises(requests.ConnectionError):
        session.post("https://push.rebind.example/x", data=b"x", timeout=2)
    assert connects.targets == [("93.184.216.34", 443)] and dns.calls["push.rebind.example"] == 1


# ------------------------------------------- TLS: connect to the checked IP, verify the name


@pytest.fixture
def tls_push(tmp_path: Path) -> Iterator[tuple[int, Path, list[str | None], list[int]]]:
    """An https server on 127.0.0.1 whose certificate names only push.rebind.test."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "push.rebind.test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("push.rebind.test")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    sni: list[str | None] = []
    posts: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # name fixed by BaseHTTPRequestHandler
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            posts.append(1)
            self.send_response(201)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    context.sni_callback = lambda _sock, server_name, _ctx: sni.append(server_name)  # type: ignore[assignment]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], cert_path, sni, posts
    finally:
        server.shutdown()
        server.server_close()


def test_tls_goes_to_the_checked_address_with_the_name_for_sni_and_certificate(
    tls_push: tuple[int, Path, list[str | None], list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, ca, sni, posts = tls_push
    dns = FakeDNS(monkeypatch, {"push.rebind.test": [["127.0.0.1"], ["10.0.0.5"]]})
    guard = EndpointGuard(allow_loopback=True, cache_s=0)
    url = f"https://push.rebind.test:{port}/push/x"
    with guarded_session(guard=guard) as session:
        session.verify = str(ca)
        assert session.post(url, data=b"x", timeout=5).status_code == 201
        assert session.post(url, data=b"y", timeout=5).status_code == 201  # the same connection, kept alive
    assert sni == ["push.rebind.test"]  # SNI and certificate check used the name, not the IP
    assert posts == [1, 1] and dns.calls["push.rebind.test"] == 1
    # a new connection: the name now points at a private address, and nothing is sent
    with guarded_session(guard=guard) as session, pytest.raises(RefusedEndpoint, match="private"):
        session.verify = str(ca)
        session.post(url, data=b"z", timeout=5)
    assert posts == [1, 1]


def test_tls_certificate_is_still_verified(
    tls_push: tuple[int, Path, list[str | None], list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, _ca, _sni, posts = tls_push
    FakeDNS(monkeypatch, {"push.rebind.test": [["127.0.0.1"]]})
    with guarded_session(allow_loopback=True) as session, pytest.raises(requests.exceptions.SSLError):
        session.post(f"https://push.rebind.test:{port}/push/x", data=b"x", timeout=5)  # not trusted
    assert posts == []
