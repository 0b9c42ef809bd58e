#!/usr/bin/env python3
"""tests/dns-hostile.py ADDR COUNTFILE: a DNS server on ADDR:53 (UDP)
that answers every query with the next of a cycle of malformed or
useless answers, each with the query's id and question, so that the
system's resolver hands them on: an answer count with no answer, a
record longer than the message, SRV data too short for its fields, a
name whose compression pointer points at itself, a target pointing
past the end, random bytes after the question, only a "." target (no
service), a target that does not resolve.  COUNTFILE gets the number
of queries answered.  For tests/filter/test-fscache-peers-dns.sh.
"""
import os
import socket
import struct
import sys

addr, countfile = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((addr, 53))


def name(n):
    return b"".join(bytes([len(p)]) + p.encode() for p in n.split(".")
                    if p) + b"\0"


def rr(rdata, rdlen=None):
    # A pointer to the question's name (offset 12), SRV, IN, a TTL.
    return (b"\xc0\x0c" + struct.pack(">HHIH", 33, 1, 5,
                                      len(rdata) if rdlen is None else rdlen)
            + rdata)


def srv(target, port=10809):
    return struct.pack(">HHH", 0, 10, port) + target


variants = [
    lambda: (1, b""),                                   # no answer at all
    lambda: (1, rr(srv(name("x.test")), rdlen=4000)),   # past the end
    lambda: (1, rr(b"\0\0\0\0\0")),                     # 5 bytes of SRV
    lambda: (1, b"\xc0\x00" + b"\xc0\x00"),             # pointer loop-ish
    lambda: (1, rr(srv(b"\xff\xff"))),                 # pointer past the end
    lambda: (3, os.urandom(64)),                        # garbage
    lambda: (1, rr(srv(b"\0"))),                        # "." only
    lambda: (1, rr(srv(name("nowhere.invalid")))),      # does not resolve
]
n = 0
while True:
    q, peer = s.recvfrom(4096)
    if len(q) < 12:
        continue
    qid = q[:2]
    question = q[12:]
    count, answer = variants[n % len(variants)]()
    head = qid + struct.pack(">HHHHH", 0x8180, 1, count, 0, 0)
    s.sendto(head + question + answer, peer)
    n += 1
    with open(countfile, "w") as f:
        f.write("%d\n" % n)
