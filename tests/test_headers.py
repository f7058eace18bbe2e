"""Header rules: hop-by-hop never crosses, framing is aiohttp's, end-to-end headers pass untouched;
`--forwarded-for` decides what is added of the client's address."""

from __future__ import annotations

from typing import get_args

from proxy.exchange.headers import HOP_BY_HOP, ForwardedFor, request_headers, response_headers


def test_hop_by_hop_and_connection_named_headers_are_dropped() -> None:
    incoming = [
        ("Host", "proxy.local:8787"),
        ("Connection", "keep-alive, X-Private"),
        ("X-Private", "1"),
        ("Keep-Alive", "timeout=5"),
        ("Proxy-Authorization", "Basic abc"),
        ("TE", "trailers"),
        ("Upgrade", "h2c"),
        ("Transfer-Encoding", "chunked"),
        ("Content-Length", "10"),
        ("Expect", "100-continue"),
        ("Authorization", "Bearer sk-test"),
        ("x-api-key", "key"),
        ("Accept-Encoding", "br"),
        ("Content-Type", "application/json"),
    ]
    out = request_headers(incoming, "10.1.2.3")
    names = {k.lower() for k in out}
    assert not names & HOP_BY_HOP
    assert not names & {"host", "content-length", "x-private", "expect"}
    assert out["Authorization"] == "Bearer sk-test"
    assert out["x-api-key"] == "key"
    assert out["Accept-Encoding"] == "br"
    assert out["Content-Type"] == "application/json"


def test_x_forwarded_for_is_appended() -> None:
    assert request_headers([], "127.0.0.1")["X-Forwarded-For"] == "127.0.0.1"
    out = request_headers([("X-Forwarded-For", "1.1.1.1"), ("x-forwarded-for", "2.2.2.2")], "127.0.0.1")
    assert out.getall("X-Forwarded-For") == ["1.1.1.1, 2.2.2.2, 127.0.0.1"]


def test_repeated_end_to_end_headers_keep_order() -> None:
    out = response_headers(
        [("Set-Cookie", "a=1"), ("Set-Cookie", "b=2"), ("Content-Encoding", "gzip"), ("Content-Length", "5")]
    )
    assert out.getall("Set-Cookie") == ["a=1", "b=2"]
    assert out["Content-Encoding"] == "gzip"
    assert "Content-Length" not in out


def test_x_forwarded_for_goes_last_and_a_connection_naming_it_drops_the_clients_chain() -> None:
    out = request_headers([("X-Forwarded-For", "1.1.1.1"), ("Connection", "keep-alive"), ("A", "1")], "127.0.0.1")
    assert list(out.items()) == [("A", "1"), ("X-Forwarded-For", "1.1.1.1, 127.0.0.1")]
    out = request_headers([("Connection", "A, X-Forwarded-For"), ("X-Forwarded-For", "1.1.1.1"), ("A", "1")], "::1")
    assert list(out.items()) == [("X-Forwarded-For", "::1")]
    # No peer (a Unix socket): the client's chain stays where it was, untouched.
    out = request_headers([("X-Forwarded-For", "1.1.1.1"), ("A", "1")], None)
    assert list(out.items()) == [("X-Forwarded-For", "1.1.1.1"), ("A", "1")]
    out = request_headers([("Connection", " , keep-alive ,"), ("A", "1")], "127.0.0.1")
    assert list(out.items()) == [("A", "1"), ("X-Forwarded-For", "127.0.0.1")]


# --- `--forwarded-for`: what the upstream learns of the client's address ---------------------

CLIENT = [("X-Forwarded-For", "1.1.1.1"), ("A", "1"), ("Forwarded", "for=2.2.2.2"), ("forwarded", "for=3.3.3.3")]


def test_append_is_the_default_and_keeps_the_clients_forwarded() -> None:
    out = request_headers(CLIENT, "10.0.0.7", "append")
    assert list(out.items()) == list(request_headers(CLIENT, "10.0.0.7").items())
    assert list(out.items()) == [
        ("A", "1"),
        ("Forwarded", "for=2.2.2.2"),
        ("forwarded", "for=3.3.3.3"),
        ("X-Forwarded-For", "1.1.1.1, 10.0.0.7"),
    ]


def test_forwarded_appends_this_hop_and_leaves_x_forwarded_for_alone() -> None:
    out = request_headers(CLIENT, "10.0.0.7", "forwarded")
    assert list(out.items()) == [
        ("X-Forwarded-For", "1.1.1.1"),
        ("A", "1"),
        ("Forwarded", "for=2.2.2.2, for=3.3.3.3, for=10.0.0.7"),
    ]
    assert list(request_headers([("A", "1")], "10.0.0.7", "forwarded").items()) == [
        ("A", "1"),
        ("Forwarded", "for=10.0.0.7"),
    ]
    # RFC 7239 §6: an IPv6 node is bracketed and quoted.
    assert request_headers([], "2001:db8::1", "forwarded").getall("Forwarded") == ['for="[2001:db8::1]"']
    assert request_headers([("Forwarded", "for=1.1.1.1")], "::1", "forwarded").getall("Forwarded") == [
        'for=1.1.1.1, for="[::1]"'
    ]


def test_off_adds_nothing_and_passes_the_clients_headers_as_they_came() -> None:
    assert list(request_headers(CLIENT, "10.0.0.7", "off").items()) == CLIENT
    assert list(request_headers([("A", "1")], "::1", "off").items()) == [("A", "1")]


def test_a_connection_header_naming_them_drops_the_clients_values_in_every_mode() -> None:
    incoming = [("Connection", "X-Forwarded-For, Forwarded"), *CLIENT]
    assert list(request_headers(incoming, "10.0.0.7", "append").items()) == [
        ("A", "1"),
        ("X-Forwarded-For", "10.0.0.7"),
    ]
    assert list(request_headers(incoming, "10.0.0.7", "forwarded").items()) == [
        ("A", "1"),
        ("Forwarded", "for=10.0.0.7"),
    ]
    assert list(request_headers(incoming, "10.0.0.7", "off").items()) == [("A", "1")]
    # Naming only X-Forwarded-For: in `forwarded` mode the client's Forwarded stays in front of ours.
    out = request_headers([("Connection", "x-forwarded-for"), *CLIENT], "10.0.0.7", "forwarded")
    assert list(out.items()) == [("A", "1"), ("Forwarded", "for=2.2.2.2, for=3.3.3.3, for=10.0.0.7")]


def test_without_a_peer_no_mode_adds_anything() -> None:
    assert get_args(ForwardedFor) == ("append", "forwarded", "off")
    for mode in get_args(ForwardedFor):
        assert list(request_headers(CLIENT, None, mode).items()) == CLIENT
        assert list(request_headers(CLIENT, "", mode).items()) == CLIENT
