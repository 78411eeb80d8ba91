"""Two or more front doors behind one virtual address (issue 17 §5): each lb host's keepalived VRRP instance.

One HAProxy host is a single point of failure for the whole fleet. With `frontdoor_vip` set, every `lb` host runs
keepalived (Debian's package) and one of them holds the virtual address clients use; when that host, its link or its
HAProxy dies, another takes the address over within a few advertisement intervals (docs/frontdoor-ha.md).

What this decides, from each lb host's gathered facts (pure: the frontdoor role passes them in):

* the interface the address lives on: the one whose IPv4 network contains it, on every lb host - an address in no
  network of a front door could not be answered there (nobody would route it to that host);
* the host's own address on that network (the source of its advertisements) and its peers' addresses there
  (unicast advertisements: no multicast needed on the LAN, nothing sent to other VRRP routers);
* its priority: the inventory's order of the `lb` group unless set (first 200, then 190, ...), so the first front
  door wins when front doors start together; every instance starts BACKUP with `nopreempt`, so the first master
  keeps the address and a front door that comes back does not take it back (moving it again would cut the streams
  of the one that holds it);
* the health check that gives the address up when the local HAProxy stops accepting connections on the front door's
  port.

Refused, with what to set, before anything on a host changes: not an IPv4 address, the address of a host's own
interface, an address outside every network of a front door, a HAProxy bound to one address (a front door taking the
virtual address over must already listen on it: bind the wildcard), out-of-range VRRP numbers.
"""
from __future__ import annotations

import ipaddress
from typing import Any, Dict, List, Mapping, Sequence, Tuple

WILDCARD_BINDS = ("", "*", "0.0.0.0", "::")
FIRST_PRIORITY = 200
PRIORITY_STEP = 10


class VrrpError(ValueError):
    """A virtual address keepalived cannot hold on these front doors; the message says what to set."""


def _networks(facts: Mapping[str, Any]) -> List[Tuple[str, ipaddress.IPv4Interface, bool]]:
    """(interface, address/prefix, primary?) of every IPv4 address in a host's gathered facts."""
    found = []
    for name in facts.get("interfaces") or []:
        entry = facts.get(str(name).replace("-", "_").replace(".", "_").replace(":", "_"))
        if not isinstance(entry, Mapping):
            continue
        addresses = [(entry.get("ipv4"), True)] + [(a, False) for a in entry.get("ipv4_secondaries") or []]
        for address, primary in addresses:
            if not isinstance(address, Mapping) or not address.get("address"):
                continue
            try:
                found.append((str(entry.get("device") or name),
                              ipaddress.IPv4Interface(f"{address['address']}/{address.get('netmask') or '32'}"),
                              primary))
            except ValueError:
                continue
    return found


def _on_network(facts: Mapping[str, Any], vip: ipaddress.IPv4Address, host: str
                ) -> Tuple[str, ipaddress.IPv4Interface]:
    """(interface, the host's own address/prefix) of the network that holds the virtual address."""
    networks = _networks(facts)
    if not networks:
        raise VrrpError(f"{host}: no IPv4 address in its gathered facts, so the interface for the front doors' "
                        f"virtual address {vip} cannot be chosen; gather its facts (the frontdoor role does, "
                        "gather_subset network) or check its interfaces")
    for interface, address, primary in networks:
        if address.ip == vip and primary:
            raise VrrpError(f"{host}: the front doors' virtual address {vip} (frontdoor_vip) is its own address on "
                            f"{interface}; the virtual address must be a free one that only keepalived holds - pick "
                            "an unused address of the front doors' network")
    own = [(interface, address) for interface, address, primary in networks
           if vip in address.network and address.ip != vip and address.network.prefixlen < 32]
    if not own:
        listing = ", ".join(f"{interface} {address}" for interface, address, _ in networks)
        raise VrrpError(f"{host}: the front doors' virtual address {vip} (frontdoor_vip) is in none of its networks "
                        f"({listing}); it must be an unused address of the network every lb host shares, so that "
                        "clients reach whichever holds it")
    return own[0]


def vrrp_instance(vip: Any, host: str, lb_hosts: Sequence[str], facts: Mapping[str, Mapping[str, Any]],
                  router_id: Any = 51, priority: Any = 0, advert_int: Any = 1, check_port: Any = 80,
                  bind_address: Any = "0.0.0.0") -> Dict[str, Any]:
    """keepalived's settings for `host` among the front doors `lb_hosts` (inventory order), or {'error': why}.

    `facts` maps each lb host to its gathered facts (at least the network subset). Returns {error: '', interface,
    address (the host's own, the advertisements' source), vip (address/prefix of its network), peers (the other front
    doors' addresses on it), priority, router_id, advert_int, check (the command keepalived runs to see that the local
    HAProxy accepts connections)}.
    """
    try:
        return dict(_instance(vip, host, list(lb_hosts), facts, router_id, priority, advert_int, check_port,
                              bind_address), error="")
    except VrrpError as exc:
        return {"error": str(exc)}


def _int_in(value: Any, name: str, low: int, high: int, why: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().isdigit():
        raise VrrpError(f"{name} is {value!r}: it must be a whole number from {low} to {high} ({why})")
    number = int(str(value).strip())
    if not low <= number <= high:
        raise VrrpError(f"{name} is {number}: it must be from {low} to {high} ({why})")
    return number


def _instance(vip: Any, host: str, lb_hosts: List[str], facts: Mapping[str, Mapping[str, Any]], router_id: Any,
              priority: Any, advert_int: Any, check_port: Any, bind_address: Any) -> Dict[str, Any]:
    try:
        address = ipaddress.ip_address(str(vip).strip())
    except ValueError:
        raise VrrpError(f"frontdoor_vip is {vip!r}: it must be one IPv4 address (no prefix, no name) - an unused "
                        "address of the network the lb hosts share, which clients and the DNS name of the front "
                        "door point at") from None
    if not isinstance(address, ipaddress.IPv4Address):
        raise VrrpError(f"frontdoor_vip is {vip}: only an IPv4 virtual address is supported (keepalived's IPv6 "
                        "addresses need VRRP version 3 on every front door); use an IPv4 address")
    if host not in lb_hosts:
        raise VrrpError(f"{host} is not in the front doors ({', '.join(lb_hosts) or 'none'}); the virtual address "
                        "is held by the `lb` group's hosts")
    if str(bind_address).strip() not in WILDCARD_BINDS:
        raise VrrpError(f"frontdoor_bind_address is {bind_address}: with a virtual address (frontdoor_vip {vip}) "
                        "HAProxy must listen on every address (0.0.0.0), so that a front door taking the address "
                        "over already accepts connections on it; remove frontdoor_bind_address")
    router = _int_in(router_id, "frontdoor_vrrp_router_id", 1, 255,
                     "one VRRP router per LAN segment: pick one no other VRRP router on it uses")
    interval = _int_in(advert_int, "frontdoor_vrrp_advert_int", 1, 255,
                       "seconds between advertisements; a backup takes over after about 3 missed ones")
    port = _int_in(check_port, "the front door's port", 1, 65535, "frontdoor_port or frontdoor_tls_port")
    chosen = _int_in(priority, "frontdoor_vrrp_priority", 0, 254, "0 = by the lb group's order")
    if chosen == 0:
        chosen = max(1, FIRST_PRIORITY - PRIORITY_STEP * lb_hosts.index(host))
    interface, own = _on_network(facts.get(host) or {}, address, host)
    peers = []
    for peer in lb_hosts:
        if peer == host:
            continue
        _, peer_address = _on_network(facts.get(peer) or {}, address, peer)
        if peer_address.network != own.network:
            raise VrrpError(f"{peer} is on {peer_address.network} and {host} on {own.network}: the front doors "
                            f"holding {vip} must share one network")
        peers.append(str(peer_address.ip))
    return {"interface": interface, "address": str(own.ip), "vip": f"{address}/{own.network.prefixlen}",
            "peers": peers, "priority": chosen, "router_id": router, "advert_int": interval,
            # bash opens a TCP connection to the local HAProxy's front port: accepted = alive. No package beyond
            # bash, and it works in any network namespace.
            "check": f"/bin/bash -c '</dev/tcp/127.0.0.1/{port}'"}


def vrrp_peers_differ(instances: Mapping[str, Mapping[str, Any]]) -> str:
    """Why the front doors' instances cannot form one VRRP router (different router ids, intervals or virtual
    addresses - set the variables for the whole `lb` group, not per host), or "" (a string either way: the role's
    assert gives it as its message, which Ansible refuses to be None)."""
    seen = {name: (i.get("router_id"), i.get("advert_int"), i.get("vip")) for name, i in instances.items()
            if not i.get("error")}
    if len(set(seen.values())) > 1:
        listing = "; ".join(f"{name}: router id {r}, advert_int {a}, {v}" for name, (r, a, v) in sorted(seen.items()))
        return (f"the front doors disagree on their VRRP settings ({listing}); set frontdoor_vip, "
                "frontdoor_vrrp_router_id and frontdoor_vrrp_advert_int once for the lb group")
    return ""
