"""The address a GPU node's replicas listen on (issue 17 §2), and the address everything reaches them at.

A replica bound to `0.0.0.0` answers on every interface of the node: a management or storage network, a container
bridge, loopback. The node's guard (docs/network.md) decides who reaches it; binding to one address decides where
it can be reached at all. So each node's replicas bind to its **serving address**:

* `revive_serve_address` when the operator sets it: an IP address that the node holds (its gathered facts list it),
  or `0.0.0.0` / `::` to bind every interface on purpose (reported as such);
* else the inventory's `ansible_host` when it is an IP address the node holds;
* else the address of the node's default route (an `ansible_host` that is a name, or a NAT address the node does
  not hold).

A choice that cannot work is refused before anything on the node changes, with what to set: a name instead of an
address (uvicorn would resolve it once, at start), a loopback address (nothing but the node could reach the
replicas), an address the node does not hold (the bind would fail at every start: "Cannot assign requested
address"), or no address at all.

Everything that reaches a replica then uses the address it listens on (`reach_host`): the unit's own health wait,
the warm-up, the SLO gate and the idle check on the node, the front door's servers and Prometheus' targets
(`release_serve_address`). A wildcard bind is reached on the node at loopback; a release recorded before replicas
had a serving address (no `host`) listens on `0.0.0.0` and is reached the same way.
"""
from __future__ import annotations

import ipaddress
from typing import Any, Dict, List, Mapping, Optional, Sequence

WILDCARDS = ("0.0.0.0", "::")
LOOPBACK = {"0.0.0.0": "127.0.0.1", "::": "::1"}


class ServeAddressError(ValueError):
    """A serving address the node's replicas cannot bind; the message names the node and what to set."""


def _ip(text: Any) -> Optional[str]:
    """The address in canonical form, or None when `text` is not one IP address."""
    try:
        return str(ipaddress.ip_address(str(text).strip()))
    except ValueError:
        return None


def node_addresses(facts: Mapping[str, Any]) -> List[str]:
    """The IP addresses a node holds, from its gathered facts (`all_ipv4_addresses`, `all_ipv6_addresses`; the
    `ansible_`-prefixed names too, as in hostvars). IPv6 link-local addresses are left out: binding one needs a
    scope (interface) that a URL and HAProxy's server line would have to carry as well."""
    found: List[str] = []
    for key in ("all_ipv4_addresses", "all_ipv6_addresses"):
        for value in facts.get(key) or facts.get(f"ansible_{key}") or []:
            address = _ip(value)
            if address and not ipaddress.ip_address(address).is_link_local and address not in found:
                found.append(address)
    return found


def serve_address(facts: Mapping[str, Any], ansible_host: Any = "", explicit: Any = "", node: str = "") -> str:
    """The address the node's replicas bind (module docstring); raises ServeAddressError naming `node`."""
    held = node_addresses(facts)
    shown = ", ".join(held) or "none in its facts"
    where = f"revive_serve_address of {node or 'the node'}"
    text = "" if explicit is None else str(explicit).strip()
    if text:
        address = _ip(text)
        if address is None:
            raise ServeAddressError(f"{where} is {text!r}, not an IP address: set one of the node's addresses "
                                    f"({shown}), or 0.0.0.0 to listen on every interface")
        if ipaddress.ip_address(address).is_loopback:
            raise ServeAddressError(f"{where} is {address}, a loopback address: only the node itself could reach "
                                    f"the replicas, not the front door or Prometheus. Set one of its addresses "
                                    f"({shown}), or \"\" to use the ansible_host or default route's address")
        if address in WILDCARDS or address in held:
            return address
        raise ServeAddressError(f"{where} is {address}, which {node or 'the node'} does not hold (its addresses: "
                                f"{shown}); the replicas could not bind it. Set one of those, or \"\" to use the "
                                "ansible_host or default route's address")
    inventory = _ip(ansible_host) if ansible_host else None
    if inventory and inventory in held:
        return inventory
    route = _ip((facts.get("default_ipv4") or facts.get("ansible_default_ipv4") or {}).get("address") or "")
    if route:
        return route
    raise ServeAddressError(f"{node or 'the node'} has no serving address: its ansible_host "
                            f"({ansible_host or 'unset'}) is not an address it holds and it has no default route; "
                            f"set revive_serve_address to one of its addresses ({shown})")


def reach_host(bound: Any) -> str:
    """The host a client on the node uses to reach a replica bound to `bound`: the address itself, loopback for a
    wildcard or for none (a release recorded before replicas had a serving address listens on 0.0.0.0)."""
    address = _ip(bound) if bound else None
    if address is None:
        return LOOPBACK["0.0.0.0"]
    return LOOPBACK.get(address, address)


def url_host(host: Any) -> str:
    """`host` as it goes into a URL: an IPv6 address in brackets."""
    text = str(host)
    return f"[{text}]" if ":" in text and not text.startswith("[") else text


def bound_host(argv: Sequence[Any]) -> str:
    """The `--host` value of a vLLM server's argv (`--host X` or `--host=X`), "" when it has none."""
    words = [str(word) for word in argv]
    for index, word in enumerate(words):
        if word == "--host" and index + 1 < len(words):
            return words[index + 1]
        if word.startswith("--host="):
            return word.split("=", 1)[1]
    return ""


def release_serve_address(release: Mapping[str, Any]) -> str:
    """The one specific address a release's replicas listen on (the planner's release: `args`, or its replicas'
    `args`/`argv`), "" when they bind every interface, name none, or disagree."""
    if not isinstance(release, Mapping):
        return ""
    argvs = [replica.get("args") or replica.get("argv") or [] for replica in release.get("replicas") or []
             if isinstance(replica, Mapping)] or [release.get("args") or []]
    hosts = {_ip(bound_host(argv)) for argv in argvs}
    if len(hosts) != 1:
        return ""
    host = hosts.pop()
    return "" if host is None or host in WILDCARDS else host


def _planned_reach(host_vars: Mapping[str, Any]) -> str:
    """The address its planned release binds (the fact revive_release), else its ansible_host, else ""."""
    release = (host_vars.get("ansible_facts") or {}).get("revive_release") or {}
    return release_serve_address(release) or str(host_vars.get("ansible_host") or "")


def node_reach_address(host_vars: Mapping[str, Any], name: str) -> str:
    """Where another host (the front door, Prometheus) reaches a node's replicas, from the node's host variables:
    the address its planned release binds, else its ansible_host, else its name. Its exporters (bound to every
    interface) are reached there too."""
    return _planned_reach(host_vars) or name


def reach_addresses(names: Sequence[str], hostvars: Mapping[str, Any]) -> Dict[str, str]:
    """{name: address or ""} for hosts to scrape: a GPU node's serving address when its release binds one, else its
    ansible_host, else "" (scraped by name)."""
    return {name: _planned_reach(hostvars[name]) for name in names}


def replica_host(replica: Mapping[str, Any]) -> str:
    """The host a client on the node reaches a recorded replica at: the address its argv binds (`reach_host`)."""
    return reach_host(bound_host(replica.get("argv") or replica.get("args") or []))


def replica_url(replica: Mapping[str, Any]) -> str:
    """`http://HOST:PORT` of a recorded replica, seen from its node."""
    return f"http://{url_host(replica_host(replica))}:{int(replica['port'])}"
