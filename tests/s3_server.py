"""A real S3-compatible server on 127.0.0.1 for the storage tests, and a way to make it fail.

`moto`'s server mode answers the S3 REST API over HTTP. Clients reach it through `FaultyEndpoint`, a TCP
relay on its own port that the tests use to inject what object stores do on a bad day: the endpoint going
away and coming back (connections refused, open ones cut; moto keeps its objects, as a real store keeps
them across a frontend restart), and throttling (`503 SlowDown` answers to new connections). Access keys
are made up by the test: moto accepts any, and a client without any fails before it sends a request.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from bertdist.train.ports import free_tcp_port

SLOWDOWN = (
    b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
)
_SLOWDOWN_BODY = (
    b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code>"
    b"<Message>Please reduce your request rate.</Message></Error>"
)


class FaultyEndpoint:
    """A TCP relay to `upstream_port` on a port of its own; `stop()`/`start()` it, or `throttle(n)` it."""

    def __init__(self, upstream_port: int):
        self.upstream_port, self.port = upstream_port, free_tcp_port()
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.throttled_left = 0
        self.throttled = 0
        """How many connections were answered 503 SlowDown."""

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        """The endpoint goes away: new connections are refused, open ones are cut mid-request."""
        listener, self._listener = self._listener, None
        if listener is not None:
            try:
                listener.shutdown(
                    socket.SHUT_RDWR
                )  # wakes the thread blocked in accept(), which a close() alone does not
            except OSError:
                pass
            listener.close()
        self._cut_open_connections()

    def throttle(self, connections: int) -> None:
        """The next `connections` new connections get `503 SlowDown`; open ones are cut so clients reconnect."""
        self.throttled_left = connections
        self._cut_open_connections()

    def _cut_open_connections(self) -> None:
        with self._lock:
            for s in list(self._open):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
            self._open.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            if self.throttled_left > 0:
                self.throttled_left -= 1
                self.throttled += 1
                threading.Thread(target=self._slow_down, args=(client,), daemon=True).start()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=10)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _slow_down(client: socket.socket) -> None:
        client.settimeout(5)
        try:
            head = b""
            while b"\r\n\r\n" not in head:
                data = client.recv(65536)
                if not data:
                    break
                head += data
            client.sendall(SLOWDOWN % (len(_SLOWDOWN_BODY), _SLOWDOWN_BODY))
        except OSError:
            pass
        finally:
            client.close()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(1 << 16):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            with self._lock:
                self._open.discard(source)
                self._open.discard(sink)


class S3Server:
    """`moto` in server mode on 127.0.0.1, in front of it a `FaultyEndpoint` that clients use."""

    def __init__(self, log_dir: Path):
        self.log_dir = Path(log_dir)
        self.moto_port = free_tcp_port()
        self.process: subprocess.Popen | None = None
        self.endpoint = FaultyEndpoint(self.moto_port)
        self.url = f"http://127.0.0.1:{self.endpoint.port}"
        self.credentials = {
            "AWS_ACCESS_KEY_ID": "bertdist-test-key",
            "AWS_SECRET_ACCESS_KEY": "bertdist-test-secret",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def start(self, timeout_s: float = 60.0) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / "moto.log", "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.moto_port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.moto_port}/", timeout=2).close()
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto server did not start: {(self.log_dir / 'moto.log').read_text()[-2000:]}")
                time.sleep(0.2)
        self.endpoint.start()

    def stop(self) -> None:
        self.endpoint.stop()
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def environment(self) -> dict[str, str]:
        """What a client process needs: the made-up keys and the endpoint (as bertdist reads it)."""
        return {**self.credentials, "AWS_ENDPOINT_URL_S3": self.url}

    def client(self):
        """boto3 straight to moto (not through the faulty endpoint): the tests' own view of the bucket."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{self.moto_port}",
            aws_access_key_id="bertdist-test-key",
            aws_secret_access_key="bertdist-test-secret",
            region_name="us-east-1",
        )

    def bucket(self, name: str) -> str:
        """A new bucket; returns its URL `s3://name`."""
        self.client().create_bucket(Bucket=name)
        return f"s3://{name}"


def upload_tree(local: str, url: str) -> None:
    from bertdist import storage

    for path in sorted(Path(local).rglob("*")):
        if path.is_file():
            storage.upload_file(str(path), storage.join(url, str(path.relative_to(local))))


def copy_prefix(source: str, target: str) -> None:
    from bertdist import storage

    for url in storage.find(source):
        with storage.atomic_write(target + url[len(source) :], "wb") as f:
            f.write(storage.read_bytes(url))
