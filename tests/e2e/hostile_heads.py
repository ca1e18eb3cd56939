"""hostile_heads.py - hostile clients of the request head, for tests/e2e/test_strict.py,
test_hostile.py and bench/hostile_load.py: request heads RFC 9112 says to refuse (each sent
on a fresh connection and followed by a plain request, so that a server that reads past the
defect answers twice), a raw exchange that counts the answers until the server closes, and
bodies the daemon refuses before reading them, sent whole without Expect: 100-continue.
"""

import re
import time

from hostile import Worker, connect, read_response

def framing_cases():
    """(name, bytes sent on a fresh connection, statuses accepted) for request heads that
    RFC 9112 says to refuse. Each is a GET /healthz with one defect, followed on the same
    connection by a plain GET /healthz: the refusal must be the only answer (a server that
    reads past the defect answers twice, and the second request may be one a proxy in front
    saw as body bytes)."""
    inner = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"

    def head(lines, target=b"/healthz"):
        return b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n" + lines + b"\r\n" + inner

    n = len(inner)
    many = b"&".join(b"p%d=1" % i for i in range(1000))
    return [
        ("space before the colon", head(b"Content-Length : %d\r\n" % n), (400,)),
        ("tab before the colon", head(b"Content-Length\t: %d\r\n" % n), (400,)),
        ("NUL in a header value", head(b"X-Note: a\0b\r\n"), (400,)),
        ("NUL hiding part of a value", head(b"Content-Length: 0\0 %d\r\n" % n), (400,)),
        ("bare CR in a header value", head(b"X-Note: a\rb\r\n"), (400,)),
        ("obs-fold (a line starting with a space)", head(b"X-Note: a\r\n b\r\n"), (400,)),
        ("obs-fold (a line starting with a tab)", head(b"X-Note: a\r\n\tb\r\n"), (400,)),
        ("a space inside the request target", head(b"", b"/healthz x"), (400,)),
        ("1,000 query parameters", head(b"", b"/healthz?" + many), (414,)),
        ("a 20 KB request target", head(b"", b"/healthz?x=" + b"y" * 20000), (414,)),
        ("a 60 KB request target of 60 parameters",
         head(b"", b"/healthz?" + b"&".join(b"p%d=1" % i for i in range(60)) + b"&x=" + b"y" * 60000), (414, 431)),
    ]


def exchange(port, data, timeout=10.0, src="127.0.0.1"):
    """Sends data on a fresh connection and reads everything until the server closes (or
    timeout). Returns (status of each answer, seconds from the send to the close, closed)."""
    s = connect(port, src, timeout)
    t0 = time.monotonic()
    raw, closed = b"", False
    try:
        try:
            s.sendall(data)
        except OSError:
            pass
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            except OSError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            raw += chunk
    finally:
        s.close()
    statuses = [int(m.group(1)) for m in re.finditer(rb"HTTP/1\.[01] (\d{3}) ", raw)]
    return statuses, time.monotonic() - t0, closed


class FramingFlood(Worker):
    """Sends the framing cases one after another, each on a fresh connection (followed by a
    plain request on it), and checks that each gets exactly one answer of the statuses it
    should, then the close. Keeps what went wrong, and the seconds each took to be closed."""

    def __init__(self, port, sources):
        super().__init__("framing")
        self.port, self.sources = port, list(sources)
        self.cases = framing_cases()
        self.sent = 0
        self.wrong = []
        self.seconds = {}  # case name -> [seconds from the send to the close]

    def body(self):
        i = 0
        while not self.halt.is_set():
            name, data, want = self.cases[i % len(self.cases)]
            statuses, secs, closed = exchange(self.port, data, timeout=30, src=self.sources[i % len(self.sources)])
            self.sent += 1
            self.seconds.setdefault(name, []).append(secs)
            if not (len(statuses) == 1 and statuses[0] in want and closed) and len(self.wrong) < 10:
                self.wrong.append((name, statuses, closed))
            i += 1


class EarlyRefusal(Worker):
    """Posts raw bodies of `mb` MiB whose Content-Length does not match the shapes in the
    query, without Expect: 100-continue, so that the daemon refuses them (400
    length_mismatch) before reading them while the client is still sending. Each must still
    get its answer; counts the ones that did not (a failed send, no answer)."""

    def __init__(self, port, sources, mb=8):
        super().__init__("early-refusal")
        self.port, self.sources = port, list(sources)
        self.body_bytes = b"\0" * (mb << 20)
        self.head = (b"POST /v1/matmul?m=1000&k=1024&n=1024&dtype=float32 HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n" % len(self.body_bytes))
        self.sent = self.answered = 0
        self.failures = []

    def body(self):
        i = 0
        while not self.halt.is_set():
            why = None
            try:
                s = connect(self.port, self.sources[i % len(self.sources)], 30)
            except OSError as e:
                self.failures.append("connect: %s" % e)
                self.halt.wait(0.2)
                continue
            try:
                s.sendall(self.head + self.body_bytes)
            except OSError as e:
                why = "sending: %s" % e
            st, _h, b = read_response(s, time.monotonic() + 30)
            s.close()
            self.sent += 1
            if why is None and st == 400 and b"length_mismatch" in b:
                self.answered += 1
            elif len(self.failures) < 10:
                self.failures.append(why or "answer %d %r" % (st, b[:120]))
            i += 1
