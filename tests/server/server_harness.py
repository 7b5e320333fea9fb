"""Starts h2o-server on loopback and talks to it with urllib only (no packages beyond Python's)."""
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request


class Server:
    """One h2o-server process on 127.0.0.1 and a free port (--port 0)."""

    def __init__(self, binary, model, *args):
        self.command = [binary, "-m", model, "--port", "0", "-t", "1", *args]
        self.process = subprocess.Popen(self.command, stderr=subprocess.PIPE, text=True)
        self.log = []
        deadline = time.time() + 30
        while time.time() < deadline:
            line = self.process.stderr.readline()
            if not line:
                raise RuntimeError("h2o-server ended before listening:\n" + "".join(self.log))
            self.log.append(line)
            found = re.search(r"listening on http://([\d.]+):(\d+)", line)
            if found:
                self.base = "http://%s:%s" % found.groups()
                self.port = int(found.group(2))
                break
        else:
            raise RuntimeError("h2o-server did not start listening")
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        for line in self.process.stderr:
            self.log.append(line)

    def request(self, method, path, body=None, raw=None, timeout=120):
        """(status, parsed JSON body) of one request; raw: bytes sent as they are."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.base + path, data=data, method=method, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def chat(self, messages, **fields):
        body = {"model": "stories260K", "messages": messages, "temperature": 0, "max_tokens": 16}
        body.update(fields)
        return self.request("POST", "/v1/chat/completions", body)

    def stream(self, messages, **fields):
        """The data payloads of a streamed completion, in order ("[DONE]" included)."""
        body = {"model": "stories260K", "messages": messages, "temperature": 0, "max_tokens": 16, "stream": True}
        body.update(fields)
        req = urllib.request.Request(self.base + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        events = []
        with urllib.request.urlopen(req, timeout=120) as response:
            assert response.headers["Content-Type"].startswith("text/event-stream"), response.headers["Content-Type"]
            for line in response:
                line = line.decode().rstrip("\n")
                if line.startswith("data: "):
                    payload = line[len("data: "):]
                    events.append(payload if payload == "[DONE]" else json.loads(payload))
        return events

    def health(self):
        return self.request("GET", "/health")[1]

    def open_stream_and_leave(self, messages, chunks_to_read, **fields):
        """Starts a streamed completion over a raw socket, reads a few chunks and disconnects."""
        body = json.dumps({"model": "stories260K", "messages": messages, "stream": True, **fields}).encode()
        sock = socket.create_connection(("127.0.0.1", self.port))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                     % len(body) + body)
        received = b""
        while received.count(b"data: ") < chunks_to_read:
            more = sock.recv(4096)
            if not more:
                break
            received += more
        sock.close()
        return received

    def stop(self, sig=signal.SIGTERM, timeout=30):
        """Sends sig and returns the exit status (None after SIGKILL)."""
        self.process.send_signal(sig)
        return self.process.wait(timeout=timeout)

    def rss(self):
        with open("/proc/%d/statm" % self.process.pid) as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
