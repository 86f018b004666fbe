"""A local Hugging Face Hub-compatible HTTP server for tests and benchmarks (127.0.0.1 only).

This is a stand-in for huggingface.co, which this machine cannot reach: it implements the endpoints
the real `huggingface_hub` client calls for publish and fetch, with the Hub's status codes and
`X-Error-Code`/`X-Error-Message` headers, so the client's own error mapping runs unchanged. It never
advertises Xet (no `X-Xet-*` headers, LFS batch answers "basic"). Blobs persist under `root/blobs/`
(content-addressed by sha256); repos, branches, tags and commits persist in `root/state.json`.

Endpoints: POST /api/repos/create; GET /api/{type}s/{id}[/revision/{rev}]; GET
/api/{type}s/{id}/tree/{rev}[/{path}] (Link-header pagination); POST /api/{type}s/{id}/paths-info/{rev};
POST /api/{type}s/{id}/preupload/{rev}; POST /[datasets/]{id}.git/info/lfs/objects/batch;
PUT /_lfs/upload/{oid}; POST /_lfs/verify; POST /api/{type}s/{id}/commit/{rev} (NDJSON, parentCommit
checked -> 412); POST /api/{type}s/{id}/branch/{name}; POST /api/{type}s/{id}/tag/{rev};
POST /api/validate-yaml; GET/HEAD /[datasets/]{id}/resolve/{rev}/{path} (Range requests answer 206).

Auth: `tokens` maps a bearer token to (user, "read"|"write"); writes need a write token whose user
owns the namespace (403 with the Hub's message otherwise); private repos need a token of the owner.

Fault injection (tests): `server.add_fault(Fault(...))` makes matching requests answer a status,
corrupt a download (same size, one byte flipped), stall mid-body, or stall an upload before reading
it. `server.log` records every request (method, path, headers without Authorization, small bodies);
`server.log_path` holds the same as JSON lines, for tests that grep everything for a token.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

LFS_THRESHOLD = 10 * 1024 * 1024
"""Files larger than this are LFS even when their first bytes look like text (the Hub's rule)."""
GITATTRIBUTES = (
    "*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
    "*.zst filter=lfs diff=lfs merge=lfs -text\n"
    "*.bin filter=lfs diff=lfs merge=lfs -text\n"
)
_CHUNK = 1 << 20


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass(kw_only=True)
class Fault:
    """One injected misbehaviour: the next `times` requests matching `method` and `path` (regex) get it.

    kind: "status" (answer `status` with `message`), "corrupt" (serve the file with one byte
    flipped, same size), "stall" (send `after_bytes` of the body then hang `seconds`, then drop the
    connection), "stall_upload" (hang `seconds` before reading an upload's body, then drop it).
    The first `after` matching requests pass untouched.
    """

    method: str
    path: str
    kind: str = "status"
    status: int = 503
    message: str = "injected fault"
    times: int = 1
    after_bytes: int = 0
    seconds: float = 30.0
    retry_after: str | None = None
    after: int = 0
    hits: int = 0


@dataclass
class Blob:
    size: int
    sha256: str
    sha1: str
    lfs: bool

    def tree_entry(self, path: str) -> dict[str, Any]:
        entry: dict[str, Any] = {"type": "file", "path": path, "size": self.size, "oid": self.sha1}
        if self.lfs:
            entry["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": 134}
        return entry


@dataclass
class Repo:
    owner: str
    private: bool
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    commits: dict[str, dict[str, Any]] = field(default_factory=dict)
    """sha -> {"parent": sha|None, "message": str, "files": {path: blob sha256}}"""


class HubServer:
    """Start with `HubServer(root, tokens=...).start()`; `url` is the endpoint; `stop()` ends it."""

    def __init__(
        self,
        root: Path,
        *,
        tokens: dict[str, tuple[str, str]] | None = None,
        lfs_threshold: int = LFS_THRESHOLD,
        tree_page_size: int = 1000,
        log_bodies: bool = True,
        xet_tokens: bool = False,
    ) -> None:
        self.root = Path(root)
        self.xet_tokens = xet_tokens
        """False: `xet-write-token` answers 404 like a Hub without Xet; True: it hands out a token (like the
        real Hub) for a Xet storage endpoint on this server that answers nothing (every CAS call 404s)."""
        (self.root / "blobs").mkdir(parents=True, exist_ok=True)
        self.tokens = dict(tokens or {})
        self.lfs_threshold = lfs_threshold
        self.tree_page_size = tree_page_size
        self.log_bodies = log_bodies
        self.lock = threading.RLock()
        self.stopping = threading.Event()
        self.repos: dict[str, Repo] = {}
        self.blobs: dict[str, Blob] = {}
        self.faults: list[Fault] = []
        self.hook: Any = None
        """callable(handler, parts, query, body) -> True when it answered the request itself (a hostile Hub)."""
        self.log: list[dict[str, Any]] = []
        self.log_path = self.root / "requests.jsonl"
        self.uploads = 0
        """LFS objects fully received and stored (PUT bodies)."""
        self.stalled = threading.Event()
        """Set when a stall fault starts hanging a request."""
        self.served_bytes: dict[str, int] = {}
        """Body bytes sent per resolve path (sum over requests)."""
        self._load()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> HubServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- state --------------------------------------------------------------------------------------

    def _load(self) -> None:
        path = self.root / "state.json"
        if not path.exists():
            return
        data = json.loads(path.read_text())
        self.blobs = {k: Blob(**v) for k, v in data["blobs"].items()}
        self.repos = {k: Repo(**v) for k, v in data["repos"].items()}

    def _save(self) -> None:
        data = {
            "blobs": {k: vars(b) for k, b in self.blobs.items()},
            "repos": {k: vars(r) for k, r in self.repos.items()},
        }
        tmp = self.root / "state.json.tmp"
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.root / "state.json")

    def add_fault(self, fault: Fault) -> Fault:
        with self.lock:
            self.faults.append(fault)
        return fault

    def take_fault(self, method: str, path: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.times > 0 and fault.method == method and re.search(fault.path, path):
                    if fault.after > 0:
                        fault.after -= 1
                        return None
                    fault.times -= 1
                    fault.hits += 1
                    return fault
        return None

    def requests(self, method: str, pattern: str) -> list[dict[str, Any]]:
        """Logged requests with this method whose path matches the regex `pattern`."""
        with self.lock:
            return [r for r in self.log if r["method"] == method and re.search(pattern, r["path"])]

    def head(self, repo_key: str, branch: str = "main") -> str:
        with self.lock:
            return self.repos[repo_key].branches[branch]

    def files_at(self, repo_key: str, rev: str = "main") -> dict[str, str]:
        """{path: sha256} of a repo at a branch, tag or commit."""
        with self.lock:
            repo = self.repos[repo_key]
            return dict(repo.commits[resolve_rev(repo, rev)]["files"])

    def blob_path(self, sha256: str) -> Path:
        return self.root / "blobs" / sha256

    def store_blob(self, data: bytes, *, lfs: bool) -> Blob:
        sha = hashlib.sha256(data).hexdigest()
        with self.lock:
            if sha not in self.blobs:
                self.blob_path(sha).write_bytes(data)
                self.blobs[sha] = Blob(size=len(data), sha256=sha, sha1=git_blob_sha1(data), lfs=lfs)
            return self.blobs[sha]

    def seed_repo(self, key: str, folder: Path, *, owner: str, lfs_min_size: int = 1) -> str:
        """Create repo `key` ("model/owner/name") holding every file under `folder` (hard-linked into the
        blob store when possible), without going through HTTP; files of `lfs_min_size` bytes or more
        are LFS. Returns the commit SHA. For benchmarks that need a large repo quickly."""
        files: dict[str, str] = {}
        for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
            h256, h1 = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % path.stat().st_size)
            with open(path, "rb") as fh:
                while chunk := fh.read(_CHUNK):
                    h256.update(chunk)
                    h1.update(chunk)
            sha = h256.hexdigest()
            with self.lock:
                if sha not in self.blobs:
                    try:
                        os.link(path, self.blob_path(sha))
                    except OSError:
                        self.blob_path(sha).write_bytes(path.read_bytes())
                    size = path.stat().st_size
                    self.blobs[sha] = Blob(size=size, sha256=sha, sha1=h1.hexdigest(), lfs=size >= lfs_min_size)
            files[path.relative_to(folder).as_posix()] = sha
        with self.lock:
            repo = Repo(owner=owner, private=False)
            repo.branches["main"] = self.new_commit(repo, None, files, "seeded")
            self.repos[key] = repo
            self._save()
            return repo.branches["main"]

    def new_commit(self, repo: Repo, parent: str | None, files: dict[str, str], message: str) -> str:
        sha = hashlib.sha1(json.dumps([parent, message, sorted(files.items()), time.time_ns()]).encode()).hexdigest()
        repo.commits[sha] = {"parent": parent, "message": message, "files": files}
        return sha


def resolve_rev(repo: Repo, rev: str) -> str:
    if rev in repo.branches:
        return repo.branches[rev]
    if rev in repo.tags:
        return repo.tags[rev]
    if rev in repo.commits:
        return rev
    raise KeyError(rev)


class _Reply(Exception):
    """Raised inside a handler to answer with an error status and the Hub's error headers."""

    def __init__(self, status: int, message: str, code: str | None = None, extra: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.extra = status, message, code, extra or {}


def _make_handler(hub: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(_HubHandler):
        server_hub = hub

    return Handler


class _HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_hub: HubServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read `hub.log`
        pass

    # -- plumbing -----------------------------------------------------------------------------------

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return self._chunked()
        data = bytearray()
        while len(data) < length:
            piece = self.rfile.read(min(_CHUNK, length - len(data)))
            if not piece:
                raise ConnectionError("client closed the upload early")
            data += piece
        return bytes(data)

    def _chunked(self) -> bytes:
        data = bytearray()
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                self.rfile.readline()
                return bytes(data)
            data += self.rfile.read(size)
            self.rfile.readline()

    def _record(self, body: bytes) -> None:
        hub = self.server_hub
        headers = {k: v for k, v in self.headers.items() if k.lower() != "authorization"}
        entry = {
            "method": self.command,
            "path": self.path,
            "headers": headers,
            "authenticated": "authorization" in {k.lower() for k in self.headers.keys()},
        }
        if hub.log_bodies and body and len(body) <= 65536:
            entry["body"] = body.decode("utf-8", "replace")
        with hub.lock:
            hub.log.append(entry)
            with open(hub.log_path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(entry) + "\n")

    def _send(
        self,
        status: int,
        payload: Any = None,
        *,
        headers: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> None:
        body = b"" if payload is None else (payload if isinstance(payload, bytes) else json.dumps(payload).encode())
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, reply: _Reply) -> None:
        headers = {"X-Error-Message": reply.message, **reply.extra}
        if reply.code:
            headers["X-Error-Code"] = reply.code
        self._send(reply.status, {"error": reply.message}, headers=headers)

    def _user(self) -> tuple[str | None, str | None]:
        auth = self.headers.get("Authorization", "")
        if not auth:
            return None, None
        token = auth.removeprefix("Bearer ").strip()
        if token not in self.server_hub.tokens:
            raise _Reply(401, "Invalid credentials in Authorization header")
        return self.server_hub.tokens[token]

    def _repo(self, kind: str, repo_id: str, *, write: bool = False) -> Repo:
        user, scope = self._user()
        repo = self.server_hub.repos.get(f"{kind}/{repo_id}")
        if repo is None or (repo.private and user != repo.owner):
            raise _Reply(404, "Repository not found", "RepoNotFound")
        if write:
            if user is None:
                raise _Reply(401, "You must be authenticated to write to a repo")
            if user != repo.owner or scope != "write":
                raise _Reply(
                    403,
                    f"You don't have the rights to write to {repo_id}: your token is not allowed to push to this repo",
                )
        return repo

    def _rev(self, repo: Repo, rev: str) -> str:
        try:
            return resolve_rev(repo, rev)
        except KeyError:
            raise _Reply(404, f"Invalid rev id: {rev}", "RevisionNotFound") from None

    # -- dispatch -----------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        hub = self.server_hub
        split = urlsplit(self.path)
        parts = [unquote(p) for p in split.path.split("/")[1:]]
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        fault = hub.take_fault(self.command, split.path)
        try:
            if fault is not None and fault.kind == "stall_upload":
                self._record(b"")
                hub.stalled.set()
                self._sleep(fault.seconds)
                self.close_connection = True
                return
            body = b"" if self.command in ("GET", "HEAD") or parts[:2] == ["_lfs", "upload"] else self._body()
            self._record(body)
            if hub.hook is not None and hub.hook(self, parts, query, body):
                return
            if fault is not None and fault.kind == "status":
                extra = {"Retry-After": fault.retry_after} if fault.retry_after is not None else None
                if parts[:2] == ["_lfs", "upload"]:
                    self._body()
                raise _Reply(fault.status, fault.message, extra=extra)
            self._route(parts, query, body, fault)
        except _Reply as reply:
            self._error(reply)
        except (ConnectionError, BrokenPipeError, TimeoutError):
            self.close_connection = True

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self.server_hub.stopping.is_set():
            time.sleep(0.05)

    def _route(self, parts: list[str], query: dict[str, str], body: bytes, fault: Fault | None) -> None:
        method = self.command
        if parts[:1] == ["api"]:
            return self._api(parts[1:], query, body)
        if parts[:2] == ["_lfs", "upload"] and method == "PUT":
            return self._lfs_put(parts[2])
        if parts[:2] == ["_lfs", "verify"] and method == "POST":
            oid = json.loads(body)["oid"]
            if oid not in self.server_hub.blobs:
                raise _Reply(404, f"LFS object {oid} was not uploaded")
            return self._send(200, {"success": True})
        kind = "dataset" if parts[:1] == ["datasets"] else "model"
        rest = parts[1:] if kind == "dataset" else parts
        if len(rest) >= 3 and rest[1].endswith(".git") and rest[2:] == ["info", "lfs", "objects", "batch"]:
            return self._lfs_batch(kind, f"{rest[0]}/{rest[1][:-4]}", body)
        if len(rest) >= 5 and rest[2] == "resolve" and method in ("GET", "HEAD"):
            return self._resolve(kind, f"{rest[0]}/{rest[1]}", rest[3], "/".join(rest[4:]), fault)
        raise _Reply(404, f"no route for {method} {self.path}")

    def _api(self, parts: list[str], query: dict[str, str], body: bytes) -> None:
        method = self.command
        if parts == ["repos", "create"] and method == "POST":
            return self._create_repo(json.loads(body or b"{}"))
        if parts == ["validate-yaml"] and method == "POST":
            return self._send(200, {"errors": [], "warnings": []})
        if len(parts) < 3 or parts[0] not in ("models", "datasets"):
            raise _Reply(404, f"no route for {method} {self.path}")
        kind, repo_id, rest = parts[0][:-1], f"{parts[1]}/{parts[2]}", parts[3:]
        if not rest and method == "GET":
            return self._info(kind, repo_id, "main")
        if rest[:1] == ["revision"] and method == "GET":
            return self._info(kind, repo_id, rest[1])
        if rest[:1] == ["tree"] and method == "GET":
            return self._tree(kind, repo_id, rest[1], "/".join(rest[2:]), query)
        if rest[:1] == ["paths-info"] and method == "POST":
            return self._paths_info(kind, repo_id, rest[1], body)
        if rest[:1] == ["xet-write-token"] and method == "GET":
            return self._xet_token(kind, repo_id)
        if rest[:1] == ["preupload"] and method == "POST":
            return self._preupload(kind, repo_id, rest[1], json.loads(body))
        if rest[:1] == ["commit"] and method == "POST":
            return self._commit(kind, repo_id, rest[1], body)
        if rest[:1] == ["branch"] and method == "POST":
            return self._branch(kind, repo_id, rest[1], json.loads(body or b"{}"))
        if rest[:1] == ["tag"] and method == "POST":
            return self._tag(kind, repo_id, rest[1], json.loads(body or b"{}"))
        raise _Reply(404, f"no route for {method} {self.path}")

    def _xet_token(self, kind: str, repo_id: str) -> None:
        hub = self.server_hub
        if not hub.xet_tokens:
            raise _Reply(404, "Not Found")  # what a Hub without Xet storage answers
        user, scope = self._user()
        if user is None or scope != "write":
            raise _Reply(401, "Invalid credentials in Authorization header")
        with hub.lock:
            self._repo(kind, repo_id)
        self._send(
            200,
            {"accessToken": "xet-test-token", "exp": int(time.time()) + 3600, "casUrl": f"{hub.url}/xet-cas"},
            headers={
                "X-Xet-Endpoint": f"{hub.url}/xet-cas",
                "X-Xet-Access-Token": "xet-test-token",
                "X-Xet-Expiration": str(int(time.time()) + 3600),
            },
        )

    # -- repos, revisions, trees ----------------------------------------------------------------------

    def _create_repo(self, payload: dict[str, Any]) -> None:
        hub = self.server_hub
        user, scope = self._user()
        kind = payload.get("type") or "model"
        owner = payload.get("organization") or user
        repo_id = f"{owner}/{payload['name']}"
        prefix = "" if kind == "model" else f"{kind}s/"
        url = f"{hub.url}/{prefix}{repo_id}"
        if user is None:
            raise _Reply(401, "You must be authenticated to create a repo")
        if owner != user or scope != "write":
            raise _Reply(403, f'You don\'t have the rights to create a {kind} under the namespace "{owner}"')
        with hub.lock:
            key = f"{kind}/{repo_id}"
            if key in hub.repos:
                return self._send(
                    409,
                    {"error": "You already created this repo", "url": url},
                    headers={"X-Error-Message": "You already created this repo"},
                )
            repo = Repo(owner=owner, private=payload.get("visibility") == "private")
            blob = hub.store_blob(GITATTRIBUTES.encode(), lfs=False)
            repo.branches["main"] = hub.new_commit(repo, None, {".gitattributes": blob.sha256}, "initial commit")
            hub.repos[key] = repo
            hub._save()
        self._send(200, {"url": url, "name": repo_id, "id": repo_id})

    def _info(self, kind: str, repo_id: str, rev: str) -> None:
        hub = self.server_hub
        with hub.lock:
            repo = self._repo(kind, repo_id)
            sha = self._rev(repo, rev)
            files = repo.commits[sha]["files"]
            data = {
                "id": repo_id,
                "_id": repo_id,
                "author": repo.owner,
                "sha": sha,
                "private": repo.private,
                "lastModified": "2026-01-01T00:00:00.000Z",
                "tags": [],
                "downloads": 0,
                "likes": 0,
                "siblings": [{"rfilename": p} for p in sorted(files)],
            }
        self._send(200, data)

    def _tree_entries(self, repo: Repo, sha: str, prefix: str, recursive: bool) -> list[dict[str, Any]]:
        hub = self.server_hub
        files = repo.commits[sha]["files"]
        base = prefix.rstrip("/") + "/" if prefix else ""
        entries: dict[str, dict[str, Any]] = {}
        for path in sorted(files):
            if not path.startswith(base):
                continue
            rest = path[len(base) :].split("/")
            for depth in range(1, len(rest)):
                folder = base + "/".join(rest[:depth])
                if recursive or depth == 1:
                    entries.setdefault(
                        folder, {"type": "directory", "path": folder, "oid": hashlib.sha1(folder.encode()).hexdigest()}
                    )
                if not recursive:
                    break
            if recursive or len(rest) == 1:
                entries[path] = hub.blobs[files[path]].tree_entry(path)
        if base and not entries:
            raise _Reply(404, f"{prefix} does not exist", "EntryNotFound")
        return [entries[k] for k in sorted(entries)]

    def _tree(self, kind: str, repo_id: str, rev: str, prefix: str, query: dict[str, str]) -> None:
        hub = self.server_hub
        with hub.lock:
            repo = self._repo(kind, repo_id)
            sha = self._rev(repo, rev)
            entries = self._tree_entries(repo, sha, prefix, query.get("recursive", "").lower() in ("1", "true"))
        start = int(query.get("cursor", "0"))
        page = entries[start : start + hub.tree_page_size]
        headers = {}
        if start + hub.tree_page_size < len(entries):
            recursive = query.get("recursive", "False")
            nxt = f"{hub.url}{urlsplit(self.path).path}?recursive={recursive}&cursor={start + hub.tree_page_size}"
            headers["Link"] = f'<{nxt}>; rel="next"'
        self._send(200, page, headers=headers)

    def _paths_info(self, kind: str, repo_id: str, rev: str, body: bytes) -> None:
        hub = self.server_hub
        form = parse_qs(body.decode())
        with hub.lock:
            repo = self._repo(kind, repo_id)
            files = repo.commits[self._rev(repo, rev)]["files"]
            out = [hub.blobs[files[p]].tree_entry(p) for p in form.get("paths", []) if p in files]
        self._send(200, out)

    # -- uploads --------------------------------------------------------------------------------------

    def _preupload(self, kind: str, repo_id: str, rev: str, payload: dict[str, Any]) -> None:
        hub = self.server_hub
        with hub.lock:
            repo = self._repo(kind, repo_id, write=True)
            files = repo.commits[self._rev(repo, rev)]["files"]
            lfs_patterns = [line.split()[0] for line in GITATTRIBUTES.splitlines() if "filter=lfs" in line]
            out = []
            for item in payload["files"]:
                sample = base64.b64decode(item["sample"])
                lfs = (
                    item["size"] > hub.lfs_threshold
                    or b"\0" in sample
                    or any(fnmatch.fnmatch(item["path"].rsplit("/", 1)[-1], pat) for pat in lfs_patterns)
                )
                remote = hub.blobs.get(files.get(item["path"], ""))
                oid = None if remote is None else (remote.sha256 if remote.lfs else remote.sha1)
                out.append(
                    {"path": item["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False, "oid": oid}
                )
        self._send(200, {"files": out, "commitOid": files and repo.branches.get(rev)})

    def _lfs_batch(self, kind: str, repo_id: str, body: bytes) -> None:
        hub = self.server_hub
        payload = json.loads(body)
        with hub.lock:
            self._repo(kind, repo_id, write=payload.get("operation") == "upload")
            objects = []
            for obj in payload["objects"]:
                item: dict[str, Any] = {"oid": obj["oid"], "size": obj["size"]}
                if obj["oid"] not in hub.blobs:
                    item["authenticated"] = True
                    item["actions"] = {
                        "upload": {"href": f"{hub.url}/_lfs/upload/{obj['oid']}"},
                        "verify": {"href": f"{hub.url}/_lfs/verify"},
                    }
                objects.append(item)
        self._send(200, {"transfer": "basic", "objects": objects}, content_type="application/vnd.git-lfs+json")

    def _lfs_put(self, oid: str) -> None:
        hub = self.server_hub
        data = self._body()
        if hashlib.sha256(data).hexdigest() != oid:
            raise _Reply(400, f"uploaded bytes do not match oid {oid}")
        hub.store_blob(data, lfs=True)
        with hub.lock:
            hub.uploads += 1
        self._send(200, None)

    def _commit(self, kind: str, repo_id: str, rev: str, body: bytes) -> None:
        hub = self.server_hub
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        with hub.lock:
            repo = self._repo(kind, repo_id, write=True)
            if rev not in repo.branches:
                raise _Reply(404, f"Invalid rev id: {rev}", "RevisionNotFound")
            head = repo.branches[rev]
            header = lines[0]["value"] if lines and lines[0]["key"] == "header" else {}
            if header.get("parentCommit") and header["parentCommit"] != head:
                raise _Reply(
                    412, f"A commit has happened since {header['parentCommit']}. Please refresh and try again."
                )
            files = dict(repo.commits[head]["files"])
            for line in lines[1:]:
                key, value = line["key"], line["value"]
                if key == "file":
                    files[value["path"]] = hub.store_blob(base64.b64decode(value["content"]), lfs=False).sha256
                elif key == "lfsFile":
                    if value["oid"] not in hub.blobs:
                        raise _Reply(422, f"LFS file {value['path']} ({value['oid']}) was not uploaded")
                    files[value["path"]] = value["oid"]
                elif key == "deletedFile":
                    if files.pop(value["path"], None) is None:
                        raise _Reply(404, f"A file with this name doesn't exist: {value['path']}", "EntryNotFound")
                elif key == "deletedFolder":
                    files = {p: s for p, s in files.items() if not p.startswith(value["path"].rstrip("/") + "/")}
                else:
                    raise _Reply(400, f"unknown commit line key {key!r}")
            sha = hub.new_commit(repo, head, files, header.get("summary", ""))
            repo.branches[rev] = sha
            hub._save()
        prefix = "" if kind == "model" else f"{kind}s/"
        self._send(
            200,
            {
                "success": True,
                "commitOid": sha,
                "commitUrl": f"{hub.url}/{prefix}{repo_id}/commit/{sha}",
                "pullRequestUrl": None,
            },
        )

    def _branch(self, kind: str, repo_id: str, branch: str, payload: dict[str, Any]) -> None:
        hub = self.server_hub
        with hub.lock:
            repo = self._repo(kind, repo_id, write=True)
            if branch in repo.branches:
                raise _Reply(409, f"Branch {branch} already exists")
            repo.branches[branch] = self._rev(repo, payload.get("startingPoint") or "main")
            hub._save()
        self._send(200, {})

    def _tag(self, kind: str, repo_id: str, rev: str, payload: dict[str, Any]) -> None:
        hub = self.server_hub
        with hub.lock:
            repo = self._repo(kind, repo_id, write=True)
            sha = self._rev(repo, rev)
            if payload["tag"] in repo.tags or payload["tag"] in repo.branches:
                raise _Reply(409, f"Tag {payload['tag']} already exists")
            repo.tags[payload["tag"]] = sha
            hub._save()
        self._send(200, {})

    # -- downloads ------------------------------------------------------------------------------------

    def _resolve(self, kind: str, repo_id: str, rev: str, path: str, fault: Fault | None) -> None:
        hub = self.server_hub
        with hub.lock:
            repo = self._repo(kind, repo_id)
            sha = self._rev(repo, rev)
            files = repo.commits[sha]["files"]
            if path not in files:
                raise _Reply(404, f"Entry not found: {path}", "EntryNotFound")
            blob = hub.blobs[files[path]]
        headers = {"X-Repo-Commit": sha, "ETag": f'"{blob.sha256 if blob.lfs else blob.sha1}"'}
        if blob.lfs:
            # The Hub answers LFS files from its CDN; the linked headers carry the real etag and size.
            # (Served directly here: a same-host redirect would be followed by HEAD, unlike a CDN's.)
            headers.update({"X-Linked-Etag": f'"{blob.sha256}"', "X-Linked-Size": str(blob.size)})
        self._serve_blob(blob, path, headers, fault)

    def _serve_blob(self, blob: Blob, key: str, headers: dict[str, str], fault: Fault | None) -> None:
        start, end = 0, blob.size
        status = 200
        ranged = self.headers.get("Range")
        if ranged:
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", ranged.strip())
            if not m or int(m.group(1)) >= max(blob.size, 1):
                raise _Reply(416, f"Range {ranged} not satisfiable", extra={"Content-Range": f"bytes */{blob.size}"})
            start, end = int(m.group(1)), min(blob.size, int(m.group(2)) + 1 if m.group(2) else blob.size)
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{blob.size}"
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command == "HEAD":
            return
        self._send_body(blob, start, end, fault, key)

    def _count(self, key: str, sent: int) -> None:
        with self.server_hub.lock:
            self.server_hub.served_bytes[key] = self.server_hub.served_bytes.get(key, 0) + sent

    def _send_body(self, blob: Blob, start: int, end: int, fault: Fault | None, key: str) -> None:
        with open(self.server_hub.blob_path(blob.sha256), "rb") as fh:
            if fault is None:
                self.wfile.flush()
                return self._count(key, self.connection.sendfile(fh, start, end - start))
            fh.seek(start)
            data = bytearray(fh.read(end - start))
        if fault.kind == "corrupt" and data:
            data[len(data) // 2] ^= 0xFF
        if fault.kind == "stall":
            cut = min(len(data), fault.after_bytes)
            self.wfile.write(data[:cut])
            self.wfile.flush()
            self._count(key, cut)
            self.server_hub.stalled.set()
            self._sleep(fault.seconds)
            self.close_connection = True
            return None
        self.wfile.write(data)
        return self._count(key, len(data))


# -- helpers for the tests that drive `portable` against this server ---------------------------------

REPO_ROOT = Path(__file__).resolve().parent.parent


def make_bundle(root: Path, files: dict[str, bytes], *, name: str = "test-bundle") -> Path:
    """Write `files` under `root` plus a bundle.json listing them (what `portable pack` would write)."""
    import sys

    sys.path.insert(0, str(REPO_ROOT))
    from reproduction.release.manifest import FileEntry, Manifest, write_manifest

    root.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    entries = [
        FileEntry(path=rel, size=len(data), sha256=hashlib.sha256(data).hexdigest()) for rel, data in files.items()
    ]
    write_manifest(root, Manifest(name=name, files=entries, metadata={"license": "apache-2.0"}))
    return root


def portable_env(hub: HubServer, home: Path, *, token: str | None, **extra: str) -> dict[str, str]:
    """A clean environment pointing huggingface_hub at `hub` (Xet off, online, private HF_HOME)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING", "PORTABLE_HUB_"))}
    env.update(
        {
            "HF_ENDPOINT": hub.url,
            "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_OFFLINE": "0",
            "HF_HOME": str(home),
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "NO_COLOR": "1",
            "OMP_NUM_THREADS": "1",
            "PORTABLE_HUB_BACKOFF_S": "0.05",
            "PORTABLE_HUB_BACKOFF_MAX_S": "0.5",
            "PORTABLE_HUB_RETRIES": "3",
        }
    )
    if token is not None:
        env["HF_TOKEN"] = token
    env.update(extra)
    return env


def portable_cmd(*args: str) -> list[str]:
    import sys

    return [sys.executable, str(REPO_ROOT / "reproduction" / "portable.py"), *args]
