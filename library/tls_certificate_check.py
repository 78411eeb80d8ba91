#!/usr/bin/python
"""Ansible module tls_certificate_check: thin wiring over module_utils/revive_tls.py."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: tls_certificate_check
short_description: Check a TLS certificate chain and its private key before a server is given them
description:
  - Reads a PEM certificate chain (the server's certificate first, then its intermediates) and its PEM private key,
    as given in variables (e.g. from Ansible Vault), and fails with the reason when a server such as HAProxy or its
    clients would refuse them - a chain that does not parse or is out of order, a key that is encrypted or is not
    the certificate's, a certificate not yet valid, expired or expiring within O(min_days_valid) days, a name in
    O(names) that the certificate's subjectAltName does not cover (wildcards cover one label), or a chain that
    O(ca_certificate) did not issue.
  - Never changes anything; run it on the controller (C(delegate_to localhost)) with C(cryptography), which
    ansible-core depends on. The key is never returned or logged.
version_added: "0.1.0"
author:
  - revive project
options:
  certificate:
    description: The PEM certificate chain, server certificate first.
    type: str
    required: true
  private_key:
    description: The unencrypted PEM private key of the first certificate.
    type: str
    required: true
  names:
    description: DNS names or IP addresses clients use to reach the server; each must be covered.
    type: list
    elements: str
    default: []
  min_days_valid:
    description: Fail when the certificate expires within this many days; V(0) fails only an expired one.
    type: int
    default: 14
  ca_certificate:
    description: PEM certificate(s) of the CA the clients trust; when given, it must have issued the chain.
    type: str
    default: ""
  variable_names:
    description: How the messages name the three texts (the variables the operator sets).
    type: dict
    default: {}
    suboptions:
      certificate:
        description: Name for O(certificate).
        type: str
        default: certificate
      private_key:
        description: Name for O(private_key).
        type: str
        default: private_key
      ca_certificate:
        description: Name for O(ca_certificate).
        type: str
        default: ca_certificate
"""

EXAMPLES = r"""
- name: Check the front door's certificate on the controller
  tls_certificate_check:
    certificate: "{{ frontdoor_tls_certificate }}"
    private_key: "{{ frontdoor_tls_key }}"
    names: [api.example.com]
    min_days_valid: 14
  delegate_to: localhost
  no_log: false
"""

RETURN = r"""
subject:
  description: The server certificate's subject (RFC 4514).
  returned: success
  type: str
  sample: CN=api.example.com
issuer:
  description: Its issuer.
  returned: success
  type: str
names:
  description: Its subjectAltName DNS names and IP addresses.
  returned: success
  type: list
  elements: str
not_after:
  description: When it expires (ISO 8601, UTC).
  returned: success
  type: str
days_left:
  description: Whole days until then.
  returned: success
  type: int
fingerprint_sha256:
  description: SHA-256 fingerprint of the server certificate (hex).
  returned: success
  type: str
chain_length:
  description: Certificates in O(certificate).
  returned: success
  type: int
key_type:
  description: The certificate's key, e.g. C(EC prime256v1) or C(RSA 2048).
  returned: success
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.revive_bounds import Bound, check_options
from ansible.module_utils.revive_tls import TLSInputError, check

# Numeric options' ranges, checked before anything else (module_utils/revive_bounds.py; docs/inputs.md).
BOUNDS = {
    "min_days_valid": Bound(int, 0, high=3650, why="days"),
}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "certificate": {"type": "str", "required": True},
            "private_key": {"type": "str", "required": True, "no_log": True},
            "names": {"type": "list", "elements": "str", "default": []},
            "min_days_valid": {"type": "int", "default": 14},
            "ca_certificate": {"type": "str", "default": ""},
            "variable_names": {"type": "dict", "default": {}, "options": {
                "certificate": {"type": "str", "default": "certificate"},
                "private_key": {"type": "str", "default": "private_key", "no_log": False},
                "ca_certificate": {"type": "str", "default": "ca_certificate"},
            }},
        },
        supports_check_mode=True,
    )
    check_options(module, BOUNDS, "tls_certificate_check")
    p = module.params
    labels = p["variable_names"]
    try:
        report = check(p["certificate"], p["private_key"], p["names"], p["min_days_valid"], p["ca_certificate"],
                       where=labels["certificate"], key_where=labels["private_key"],
                       ca_where=labels["ca_certificate"])
    except TLSInputError as error:
        module.fail_json(msg=str(error))
    module.exit_json(changed=False, msg=f"{report.subject}: valid for {', '.join(report.names)} until "
                                        f"{report.not_after} ({report.days_left} days), key {report.key_type}",
                     **report.to_dict())


if __name__ == "__main__":
    main()
