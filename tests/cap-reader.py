# cap-reader.py URI IMAGE random | hot HOT DONEFILE: the readers of the
# max-size tests (test-fscache-max-size.sh, test-share-max-size.sh).
#
#   random   reads every 64 KiB block once, in a random order;
#   hot      reads 4 KiB at random in [0, HOT) until DONEFILE exists
#            (at most 60 s), after creating DONEFILE.ready.
#
# Every read is compared with IMAGE; exits non-zero at the first that
# differs.  Prints the number of reads.  READER_SEED, if set, seeds the
# order (else it differs each run).
import os, random, sys, time
import nbd

uri, img, mode = sys.argv[1], sys.argv[2], sys.argv[3]
h = nbd.NBD()
h.connect_uri(uri)
size = h.get_size()
data = open(img, "rb").read(size if mode == "random" else int(sys.argv[4]))
seed = os.environ.get("READER_SEED")
rnd = random.Random(int(seed) if seed else None)
n = 0
if mode == "random":
    blocks = list(range(0, size, 65536))
    rnd.shuffle(blocks)
    for off in blocks:
        k = min(65536, size - off)
        if h.pread(k, off) != data[off:off + k]:
            sys.exit("random: wrong data at %d" % off)
        n += 1
elif mode == "hot":
    hot, done, limit = int(sys.argv[4]), sys.argv[5], time.time() + 60
    open(done + ".ready", "w").close()
    while not os.path.exists(done) and time.time() < limit:
        off = rnd.randrange(0, hot // 4096) * 4096
        if h.pread(4096, off) != data[off:off + 4096]:
            sys.exit("hot: wrong data at %d" % off)
        n += 1
print(n)
