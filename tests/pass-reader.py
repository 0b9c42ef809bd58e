# A checking reader for the daemon's tests, on one long-lived libnbd
# connection (so that its object stays locked, in use, all along).
#
#   pass-reader.py URI IMAGE seq|random FAILFILE PASSFILE STOPFILE
#
# Makes whole passes over the export in 1 MiB reads (in order, or
# shuffled for "random"), each compared with IMAGE, until STOPFILE
# exists.  Every failed read or difference is appended to FAILFILE;
# PASSFILE holds the number of passes finished (rewritten atomically
# after each).
import os
import random
import sys

import nbd

uri, img, order, failf, passf, stopf = sys.argv[1:]
data = open(img, "rb").read()
h = nbd.NBD()
h.connect_uri(uri)
size = h.get_size()
offs = list(range(0, size, 1 << 20))
n = 0
while not os.path.exists(stopf):
    if order == "random":
        random.shuffle(offs)
    for off in offs:
        cnt = min(1 << 20, size - off)
        try:
            buf = h.pread(cnt, off)
        except nbd.Error as e:
            open(failf, "a").write("pass %d: read at %d: %s\n" % (n, off, e))
            continue
        if buf != data[off:off + cnt]:
            open(failf, "a").write("pass %d: data differs at %d\n" % (n, off))
    n += 1
    with open(passf + ".tmp", "w") as f:
        f.write("%d\n" % n)
    os.rename(passf + ".tmp", passf)
h.shutdown()
