"""``ssrf_probe``: does a request that names an address make a replica connect there, and with what? A P/D
cluster beside a colocated replica (``kvemu up --replicas 1 --prefill-replicas 1 --decode-replicas 1``) and a
plain TCP listener that records every connection it gets; requests through the router and straight to each
replica name the listener, in SGLang's bootstrap fields and in vLLM's ``kv_transfer_params``. Then the
port-scan check: the same requests naming a closed port, an open port that does not speak HTTP and an HTTP
port must get the same answers, or a client learns which ports are open behind the replica."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections import Counter

from .cluster import free_port, get_json
from .traffic import PREFIXES
from .up import Up, held

ROOM = 4242


class Listener:
    """A TCP server on 127.0.0.1 in a thread; each connection: what it received (up to 64 KiB, until a whole
    HTTP request came or the peer was quiet for 0.5 s), then closed with no answer. ``banner``: bytes it sends
    first (an open port of something that is not HTTP, such as SSH)."""

    def __init__(self, banner: bytes = b"") -> None:
        self.banner = banner
        self.connections: list[bytes] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()
        self._ready.wait(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = b""
        try:
            if self.banner:
                writer.write(self.banner)
                await writer.drain()
            while len(data) < 65536 and not _whole_request(data):
                chunk = await asyncio.wait_for(reader.read(65536), 0.5)
                if not chunk:
                    break
                data += chunk
        except (TimeoutError, OSError):
            pass
        self.connections.append(data)
        writer.close()

    def carrying(self, token: str) -> int:
        return sum(1 for c in self.connections if token.encode() in c)

    def heads(self) -> list[str]:
        """Each connection's request line and header names (values left out: one may be the token)."""
        out = []
        for c in self.connections:
            lines = c.split(b"\r\n\r\n", 1)[0].decode(errors="replace").split("\r\n")
            out.append(" | ".join([lines[0], *(h.split(":", 1)[0] for h in lines[1:])]))
        return out

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)


def _whole_request(data: bytes) -> bool:
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    return len(body) >= (int(m.group(1)) if m else 0)


def post(url: str, body: dict, timeout: float = 90.0) -> tuple[int | str, str, float]:
    """(status or the error's name, the answer's text, seconds)."""
    status, text, secs, _ = post_via(url, body, timeout)
    return status, text, secs


def post_via(url: str, body: dict, timeout: float = 90.0) -> tuple[int | str, str, float, str]:
    """``post``'s answer and the replica a router says served it (X-Kvemu-Replica; "" from a replica)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    t = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            via = resp.headers.get("X-Kvemu-Replica", "")
            return resp.status, resp.read().decode(errors="replace"), time.monotonic() - t, via
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace"), time.monotonic() - t, ""
    except OSError as err:
        return type(err).__name__, "", time.monotonic() - t, ""


def _body(i: int, port: int, wire: str) -> dict:
    out: dict = {"prompt": PREFIXES[i % len(PREFIXES)][:64], "max_tokens": 2}
    if wire == "bootstrap":
        out.update({"bootstrap_room": ROOM + i, "bootstrap_host": "127.0.0.1", "bootstrap_port": port})
    else:
        out["kv_transfer_params"] = {"do_remote_prefill": True, "remote_host": "127.0.0.1", "remote_port": port,
                                     "remote_request_id": "x"}
    return out


def _probes(up: Up) -> list[tuple[str, str, str]]:
    """(target name, its URL, wire): the router and every replica get SGLang's fields; the router, the decode
    and the colocated replicas get vLLM's (a prefill replica refuses a decode leg by its role). The router gets
    SGLang's four times, short prompts of four prefixes: it decodes them where it likes (the decode or the
    colocated replica), and only a decode replica acts on the fields."""
    reps = up.replicas()
    out = [("router", up.router, "bootstrap")] * 4 + [("router", up.router, "kv_transfer_params")]
    out += [(rid, url, "bootstrap") for rid, url in reps.items()]
    out += [(rid, url, "kv_transfer_params") for rid, url in reps.items() if not rid.startswith("prefill-")]
    return out


def _normal(status: int | str, text: str, port: int, room: int) -> str:
    """An answer with what the probe itself put in it (the port, the room) taken out: 200 answers as 200."""
    if status == 200:
        return "200"
    try:
        msg = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        msg = text[:200]
    return f"{status} {msg.replace(str(port), 'PORT').replace(str(room), 'ROOM')}"


def port_scan(up: Up, url: str) -> dict:
    """Each wire to the decode replica naming a closed port, an open non-HTTP port (an SSH-like banner) and an
    HTTP port (the router's): the answers, and whether they differ; the replica's failovers by reason (a
    /stats anyone may read) beside each."""
    banner = Listener(banner=b"SSH-2.0-OpenSSH_9.6\r\n")
    ports = {"closed": free_port(), "open_not_http": banner.port, "http": int(up.router.rsplit(":", 1)[1])}
    out: dict = {}
    try:
        for wire in ("kv_transfer_params", "bootstrap"):
            rows = {}
            for k, (name, port) in enumerate(ports.items()):
                before = get_json(url + "/stats", timeout=5.0)["pd"]["failovers"]
                status, text, secs = post(url + "/v1/completions", _body(100 + k, port, wire))
                after = get_json(url + "/stats", timeout=5.0)["pd"]["failovers"]
                rows[name] = {"status": status, "answer": _normal(status, text, port, ROOM + 100 + k),
                              "ms": round(secs * 1000, 1),
                              "failovers": {r: after[r] - before.get(r, 0) for r in after if after[r] != before.get(r, 0)}}
            out[wire] = {"ports": rows, "answers_differ": len({r["answer"] for r in rows.values()}) > 1,
                         "failovers_differ": len({json.dumps(r["failovers"]) for r in rows.values()}) > 1}
    finally:
        banner.stop()
    return out


def ssrf_probe() -> dict:
    listener = Listener()
    up = Up("--replicas", "1", "--prefill-replicas", "1", "--decode-replicas", "1", "--capacity-blocks", "4000",
            "--time-scale", "0.05").start()
    try:
        requests = []
        for i, (target, url, wire) in enumerate(_probes(up)):
            n0 = len(listener.connections)
            status, text, secs, via = post_via(url + "/v1/completions", _body(i, listener.port, wire))
            time.sleep(0.2)  # a connection the replica made late still counts for this request
            got = listener.connections[n0:]
            requests.append({"target": target, "wire": wire, "status": status, "ms": round(secs * 1000, 1),
                             **({"served_by": via} if via else {}),
                             "listener_connections": len(got),
                             "carried_token": sum(1 for c in got if up.token.encode() in c),
                             "answer": _normal(status, text, listener.port, ROOM + i)[:160]})
        scan = port_scan(up, up.replicas("decode-")["decode-0"])
        pinned = held(up)
        failed = Counter(f"http_{r['status']}" if isinstance(r["status"], int) else r["status"]
                         for r in requests if r["status"] != 200)
        return {"sent": len(requests), "answered": sum(1 for r in requests if r["status"] == 200),
                "failed": sum(failed.values()), "failed_by_cause": dict(sorted(failed.items())),
                "refused": sum(1 for r in requests if isinstance(r["status"], int) and 400 <= r["status"] < 500),
                "lost": sum(1 for r in requests if not isinstance(r["status"], int) or r["status"] >= 500),
                "listener_connections": len(listener.connections),
                "connections_with_token": listener.carrying(up.token), "listener_heads": listener.heads(),
                "requests": requests, "port_scan": scan, "pinned_after": pinned["held_blocks"],
                "pinned_after_per_replica": pinned["per_replica"], "up_running_at_end": up.running()}
    finally:
        up.stop()
        listener.stop()
