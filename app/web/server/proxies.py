"""Which client a request comes from when reverse proxies stand in front of Kiln: the one
rule the per-client limits (tabs holding an image, upload bytes per hour) key on.

A proxy connects on behalf of everyone behind it, so its address alone would put all of
them under one set of limits. Each proxy appends the address it got the request from to
``X-Forwarded-For``; whatever stands to the left of that was written by someone earlier,
the client included. So only the entries the trusted proxies wrote are believed: walk the
header from the right, passing over trusted proxies; the first address that is not one is
the client. A request whose connecting address is not a trusted proxy is counted against
that address, and its ``X-Forwarded-For`` is ignored, whatever it says.

Only ``X-Forwarded-For`` is read, not the standard ``Forwarded: for=``: nginx
(``$proxy_add_x_forwarded_for``), HAProxy, Caddy, Traefik and the cloud load balancers
write the former, few write the latter, and a proxy passes a header it does not write on
unchanged; reading both would let a client choose, with a ``Forwarded`` header of its own,
the address its limits are counted against.
"""

from __future__ import annotations

import ipaddress
from typing import Iterable, Optional, Sequence, Union

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]


def parse_address(text: str) -> Optional[IPAddress]:
    """The IP address in ``text`` as proxies and servers write one: ``1.2.3.4``,
    ``1.2.3.4:5678``, ``::1``, ``[::1]:80``; an IPv4 address seen over IPv6
    (``::ffff:1.2.3.4``) as the IPv4 address, so one client has one name. None for anything
    else (``unknown``, a hostname, a unix socket)."""
    t = text.strip()
    if t.startswith("["):
        t = t[1:t.find("]")] if "]" in t else t[1:]
    elif t.count(":") == 1:
        t = t.split(":", 1)[0]
    try:
        ip = ipaddress.ip_address(t)
    except ValueError:
        return None
    mapped = getattr(ip, "ipv4_mapped", None)
    return mapped or ip


def normal_address(text: str) -> str:
    """``text`` as ``parse_address`` reads it, written one way; as it is when it is no IP."""
    ip = parse_address(text)
    return str(ip) if ip is not None else text


class TrustedProxies:
    """The reverse proxies whose ``X-Forwarded-For`` is believed (``app.trusted_proxies``:
    IP addresses and CIDR networks, checked where settings are loaded). None by default:
    then every request is its connecting address's."""

    def __init__(self, networks: Iterable[str] = ()):
        self._networks = tuple(ipaddress.ip_network(n) for n in networks)

    def __bool__(self) -> bool:
        return bool(self._networks)

    def trusts(self, host: str) -> bool:
        ip = parse_address(host)
        return ip is not None and self._trusts(ip)

    def _trusts(self, ip: IPAddress) -> bool:
        return any(ip in net for net in self._networks)

    def client(self, peer: str, forwarded_for: Sequence[str]) -> str:
        """The client of a request that came from ``peer`` (the connecting address) with
        these ``X-Forwarded-For`` header values (a request may carry several: they are one
        list, in order).

        From a peer that is not a trusted proxy: the peer. Else the right-most address that is
        not a trusted proxy; every address a trusted proxy: the left-most (the request came
        from a proxy's own machine). An entry that is no address stops the walk at the
        nearest trusted proxy, which is then counted as the client: it wrote that entry (or
        passed it on), and nothing further left can be believed."""
        if not self.trusts(peer):
            return normal_address(peer)
        nearest = normal_address(peer)
        hops = [hop.strip() for value in forwarded_for for hop in value.split(",")]
        for hop in reversed([h for h in hops if h]):
            ip = parse_address(hop)
            if ip is None:
                return nearest
            if not self._trusts(ip):
                return str(ip)
            nearest = str(ip)
        return nearest
