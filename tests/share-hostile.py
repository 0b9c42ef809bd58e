#!/usr/bin/env python3
# A hostile client of an object's share socket (core/share/share-owner.c; the
# protocol in docs/format.md, "The share socket"), for
# tests/share/test-share-hostile.sh.  Messages: a header of native-order
# fields (magic, type, flags, count, err, offset) and COUNT bytes.
#
#   capture SOCK OUT        listen at SOCK, take one joiner's hello
#                           (header and payload) into OUT, hang up
#   idle SOCK N             N connections that never say hello; exit 0
#                           once the owner has closed every one it took
#                           (at most 30 s), printing how many it took
#   attack SOCK HELLO SIZE  after a hello (from capture), each bad
#                           message on its own connection: the owner
#                           must close the link (at most 30 s each), or
#                           answer with an error (a map past the end)
#   claim SOCK HELLO OFF N READY
#                           READ OFF+N, take the owner's FETCH, create
#                           READY, never answer; exit 0 once the owner
#                           has given up on us (closed the link)
#   join SOCK HELLO         a hello; exit 0 if the owner hangs up with no
#                           welcome, 1 if it welcomes us
#   report SOCK HELLO       a hit report of 10^15 requests and 10^18
#                           bytes (block 0): exit 0 once the owner has
#                           answered it
#   fake-owner SOCK SIZE EVENTS
#                           listen at SOCK as an owner that welcomes every
#                           joiner, fails its maps, and answers a READ
#                           with a FETCH at SIZE (outside the export);
#                           each hello adds "hello" to EVENTS, and each
#                           link the joiner then closes a line saying so.
#                           With FSC_FAKE_OWNER_UID=U:G in the
#                           environment it binds SOCK as who started it
#                           (root, in root's own directory) and then
#                           becomes U:G before it listens: the peer's
#                           credentials (SO_PEERCRED, taken at listen)
#                           are then U's, in a directory nobody else
#                           may write (the joiner's last line of defence
#                           against an owner of another user).
#                           Runs until killed.
import os, resource, select, socket, struct, sys, time

MAGIC = 0x46534831
HDR = struct.Struct("=IHHIiQ")
HELLO, WELCOME, READ, PREFETCH, WBEGIN, WEND, COMMIT, FETCH, FETCHED, \
    DONE, MAP, REF = range(1, 13)


def msg(type, count=0, offset=0, flags=0, err=0, magic=MAGIC):
    return HDR.pack(magic, type, flags, count, err, offset)


def closed_by_peer(s, timeout):
    """True once the peer has closed S (what it sends is read and
    dropped), False after TIMEOUT seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        r, _, _ = select.select([s], [], [], max(0, end - time.monotonic()))
        if not r:
            continue
        try:
            if not s.recv(1 << 16):
                return True
        except ConnectionError:
            return True
    return False


def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    return s


def hello(path, hello_bytes):
    s = connect(path)
    s.sendall(hello_bytes)
    h = s.recv(HDR.size, socket.MSG_WAITALL)
    if len(h) != HDR.size:
        raise SystemExit("no welcome")
    magic, type, flags, count, err, off = HDR.unpack(h)
    s.recv(count, socket.MSG_WAITALL)
    if type != WELCOME or err != 0:
        raise SystemExit("refused: type %d err %d" % (type, err))
    return s


def capture(path, out):
    l = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    l.bind(path)
    l.listen(1)
    c, _ = l.accept()
    h = c.recv(HDR.size, socket.MSG_WAITALL)
    magic, type, flags, count, err, off = HDR.unpack(h)
    assert magic == MAGIC and type == HELLO, (magic, type)
    p = c.recv(count, socket.MSG_WAITALL)
    open(out, "wb").write(h + p)
    c.close()
    l.close()
    os.unlink(path)


def idle(path, n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    socks = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(path)
            socks.append(s)
        except (BlockingIOError, ConnectionRefusedError, OSError):
            s.close()
    print("connected %d of %d" % (len(socks), n), flush=True)
    sys.stdout.flush()
    # The test samples the owner now; then every one we hold must be
    # closed by the owner (refused at once, or no hello in time).
    end = time.monotonic() + 30
    left = {s.fileno(): s for s in socks}
    p = select.poll()
    for fd in left:
        p.register(fd, select.POLLIN)
    while left and time.monotonic() < end:
        for fd, ev in p.poll(500):
            s = left[fd]
            try:
                if s.recv(4096):
                    continue
            except BlockingIOError:
                continue
            except ConnectionError:
                pass
            p.unregister(fd)
            del left[fd]
    print("still open after 30 s: %d" % len(left), flush=True)
    sys.exit(0 if not left else 1)


def attack(path, hello_bytes, size):
    cases = [
        ("a hit report of 64 MiB", msg(REF, 64 << 20)),
        ("a hit report of 257 blocks", msg(REF, (257 + 2) * 8)),
        ("a read at the end", msg(READ, 4096, size)),
        ("a read across the end", msg(READ, 8192, size - 4096)),
        ("a read whose end overflows", msg(READ, 8192, (1 << 64) - 4096)),
        ("a read of 128 MiB", msg(READ, 128 << 20, 0)),
        ("a prefetch past the end", msg(PREFETCH, 65536, size)),
        ("a write-begin past the end", msg(WBEGIN, 65536, size)),
        ("a write-end with no begin", msg(WEND, 0)),
        ("an unknown type", msg(99)),
        ("a bad magic", msg(READ, 4096, 0, magic=0x12345678)),
    ]
    bad = 0
    # A map of a group past the end is answered with an error.
    s = hello(path, hello_bytes)
    s.sendall(msg(MAP, 0, 1 << 40))
    h = s.recv(HDR.size, socket.MSG_WAITALL)
    if len(h) == HDR.size and HDR.unpack(h)[1] == DONE and \
       HDR.unpack(h)[4] != 0 and HDR.unpack(h)[3] == 0:
        print("refused with errno %d: a map of a group past the end" %
              HDR.unpack(h)[4])
    else:
        print("NOT REFUSED: a map of a group past the end")
        bad += 1
    s.close()
    for what, m in cases:
        s = hello(path, hello_bytes)
        s.sendall(m)
        if closed_by_peer(s, 30):
            print("closed: %s" % what)
        else:
            print("NOT CLOSED: %s" % what)
            bad += 1
        s.close()
    sys.exit(1 if bad else 0)


def claim(path, hello_bytes, off, n, ready):
    s = hello(path, hello_bytes)
    s.sendall(msg(READ, n, off))
    h = s.recv(HDR.size, socket.MSG_WAITALL)
    magic, type, flags, count, err, o = HDR.unpack(h)
    if type != FETCH:
        raise SystemExit("the owner sent type %d, not a fetch" % type)
    print("the owner asks us to fetch %d+%d: never answered" % (o, count),
          flush=True)
    open(ready, "w").close()
    if closed_by_peer(s, 120):
        print("the owner gave up on us")
        sys.exit(0)
    print("the owner still waits for us after 120 s")
    sys.exit(1)


def join(path, hello_bytes):
    s = connect(path)
    try:
        s.sendall(hello_bytes)
        h = s.recv(HDR.size, socket.MSG_WAITALL)
    except ConnectionError:
        h = b""
    if len(h) == HDR.size and HDR.unpack(h)[1] == WELCOME:
        print("welcomed")
        sys.exit(1)
    print("hung up on, no welcome")
    sys.exit(0)


def report(path, hello_bytes):
    s = hello(path, hello_bytes)
    p = struct.pack("=QQQ", 10**15, 10**18, 0)
    s.sendall(msg(REF, len(p)) + p)
    h = s.recv(HDR.size, socket.MSG_WAITALL)
    if len(h) != HDR.size or HDR.unpack(h)[1] != DONE:
        raise SystemExit("no answer to the report")
    print("reported 10^15 hits of 10^18 bytes")


def fake_owner(path, size, events):
    import threading
    l = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    l.bind(path)
    drop = os.environ.get("FSC_FAKE_OWNER_UID")
    if drop:
        uid, gid = (int(x) for x in drop.split(":"))
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    l.listen(64)

    def serve(c):
        h = c.recv(HDR.size, socket.MSG_WAITALL)
        if len(h) != HDR.size:
            return
        c.recv(HDR.unpack(h)[3], socket.MSG_WAITALL)
        with open(events, "a") as f:
            f.write("hello\n")
        c.sendall(msg(WELCOME, 24) +
                  struct.pack("=iIiIQ", os.getpid(), 0, 0, 0, 0))
        while True:
            h = c.recv(HDR.size, socket.MSG_WAITALL)
            if len(h) != HDR.size:
                return
            magic, type, flags, count, err, off = HDR.unpack(h)
            if type in (REF, WEND) and count:
                c.recv(count, socket.MSG_WAITALL)
            if type != READ:
                c.sendall(msg(DONE, 0, err=5))
                continue
            c.sendall(msg(FETCH, 65536, size))
            if closed_by_peer(c, 30):
                with open(events, "a") as f:
                    f.write("the joiner closed the link on a fetch at %d\n"
                            % size)
            return

    while True:
        c, _ = l.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()


cmd = sys.argv[1]
if cmd == "capture":
    capture(sys.argv[2], sys.argv[3])
elif cmd == "idle":
    idle(sys.argv[2], int(sys.argv[3]))
elif cmd == "attack":
    attack(sys.argv[2], open(sys.argv[3], "rb").read(), int(sys.argv[4]))
elif cmd == "claim":
    claim(sys.argv[2], open(sys.argv[3], "rb").read(), int(sys.argv[4]),
          int(sys.argv[5]), sys.argv[6])
elif cmd == "join":
    join(sys.argv[2], open(sys.argv[3], "rb").read())
elif cmd == "report":
    report(sys.argv[2], open(sys.argv[3], "rb").read())
elif cmd == "fake-owner":
    fake_owner(sys.argv[2], int(sys.argv[3]), sys.argv[4])
else:
    raise SystemExit("unknown command " + cmd)
