"""The lab: a local fleet of Debian 12 hosts booted by systemd-nspawn, reached over real SSH.

`bin/lab` is the command line; this package is its implementation. Modules:
  shape      which hosts a lab has, their addresses and GPU profiles (pure)
  rootfs     the debootstrapped Debian 12 root every host starts from (cached)
  system     namespaces, links, mounts, cgroups and nspawn processes (root only)
  state      the record of everything `up` made, so `down` removes exactly that
  access     SSH key, known_hosts, ssh_config and the Ansible inventory (pure rendering)
  ready      waiting, over paramiko, until a booted host answers SSH and systemd is up
  fleet      up / down / status / set-profile, composed from the above
  cli        argument parsing
"""
