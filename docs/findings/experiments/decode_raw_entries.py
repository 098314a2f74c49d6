#!/usr/bin/env python3
"""List the raft entry (term, index) pairs found in a raw 4 KiB block dumped by crashloop.py
(results/*.raw-m<i>-lb<N>): looks for raftpb.Entry encodings 08 00 10 <term> 18 <index varint>."""
import re, sys
def varint(b):
    v = 0
    for k, x in enumerate(b):
        v |= (x & 0x7f) << (7 * k)
    return v
for p in sys.argv[1:]:
    d = open(p, "rb").read()
    ents = [(varint(m[1]), varint(m[2])) for m in
            re.finditer(rb"\x08\x00\x10([\x80-\xff]*[\x00-\x7f])\x18([\x80-\xff]*[\x00-\x7f])", d)]
    print(p, f"nonzero={sum(1 for x in d if x)}", "entries(term,index)=", ents)
