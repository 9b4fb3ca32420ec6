"""A loopback stand-in for the Hugging Face Hub: just the kernel-repo requests our client makes.

``huggingface_hub`` (2.4) and ``kernels`` (0.17.2) talk to it unchanged through ``HF_ENDPOINT`` or
``HfApi(endpoint=...)``. It keeps every repo in memory as git-like commits (a full file map per
commit, branches and pull-request refs pointing at commits) and answers:

publishing
    ``POST /api/repos/create`` (409 + ``"url"`` when the repo exists), ``POST /api/validate-yaml``,
    ``GET /api/kernels/<id>/refs``, ``POST /api/kernels/<id>/branch/<name>``,
    ``POST /api/kernels/<id>/preupload/<rev>`` (every file "regular": sent inline, base64, in the
    commit; the ``oid`` of the file already at ``rev`` lets the client drop unchanged files),
    ``POST /api/kernels/<id>/commit/<rev>`` (NDJSON: a ``header`` line, then ``file`` /
    ``deletedFile`` / ``deletedFolder`` lines; ``parentCommit`` checked, ``?create_pr=1`` opens
    ``refs/pr/<n>`` against ``rev``);
loading
    ``GET /api/organizations/<org>/overview`` (``trustedKernelPublisher``),
    ``GET /api/kernels/<id>[/revision/<rev>]``, ``GET /api/kernels/<id>/tree/<rev>[/<path>]``
    (``?recursive=``), ``HEAD``/``GET /kernels/<id>/resolve/<rev>/<path>`` (``X-Repo-Commit``,
    ``ETag`` = git blob id, ``Content-Length``).

Errors carry the ``X-Error-Code`` header huggingface_hub maps to its exceptions (``RepoNotFound``,
``RevisionNotFound``, ``EntryNotFound``). Writes need an ``Authorization`` header; a private repo is
invisible without one. Every request is recorded in :attr:`HubServer.requests`; one the server
does not know is answered 404 and also kept in :attr:`HubServer.unhandled`. Besides the Hub API
proper it answers ``GET /api/agent-harnesses`` (huggingface_hub fetches it for its user agent), and
:meth:`HubServer.fail_once` makes one chosen request fail with a 500 (to test recovery).
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["HubServer", "git_blob_id"]

_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


def git_blob_id(data: bytes) -> str:
    """The git object id of a file's bytes (what the Hub reports as a regular file's ``oid``)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class _Commit:
    sha: str
    parent: str | None
    files: dict[str, bytes]
    summary: str


@dataclass
class _Repo:
    repo_id: str
    private: bool
    commits: dict[str, _Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)  # name -> commit sha
    pulls: dict[int, str] = field(default_factory=dict)  # number -> commit sha


class _HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, extra: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.extra = status, message, code, extra or {}


class HubServer:
    """The server state plus a ``ThreadingHTTPServer`` on ``127.0.0.1:<free port>``.

    Args:
        trusted_orgs: organisations whose overview says ``trustedKernelPublisher: true``.
    """

    def __init__(self, trusted_orgs: tuple[str, ...] = ()):
        self.trusted_orgs = set(trusted_orgs)
        self.repos: dict[str, _Repo] = {}
        self.requests: list[tuple[str, str]] = []
        self.unhandled: list[tuple[str, str]] = []
        self._faults: list[tuple[str, str]] = []
        self._lock = threading.RLock()
        self._counter = itertools.count()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "HubServer":
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="hub-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    # --- state helpers (used by the tests too) ---------------------------------------------

    def fail_once(self, method: str, path_fragment: str) -> None:
        """Answer the next ``method`` request whose path contains ``path_fragment`` with a 500."""
        with self._lock:
            self._faults.append((method, path_fragment))

    def branch_files(self, repo_id: str, branch: str) -> dict[str, bytes]:
        """The files at the head of ``branch`` (a copy)."""
        with self._lock:
            repo = self.repos[repo_id]
            return dict(repo.commits[repo.branches[branch]].files)

    def branch_head(self, repo_id: str, branch: str) -> str:
        with self._lock:
            return self.repos[repo_id].branches[branch]

    def _new_commit(self, repo: _Repo, parent: str | None, files: dict[str, bytes], summary: str) -> str:
        digest = hashlib.sha1(f"{repo.repo_id}\0{parent}\0{summary}\0{next(self._counter)}".encode())
        for path in sorted(files):
            digest.update(f"{path}\0{git_blob_id(files[path])}\0".encode())
        sha = digest.hexdigest()
        repo.commits[sha] = _Commit(sha=sha, parent=parent, files=files, summary=summary)
        return sha

    def _repo(self, repo_id: str, authorized: bool) -> _Repo:
        repo = self.repos.get(repo_id)
        if repo is None or (repo.private and not authorized):
            raise _HubError(404, f"Repository Not Found for url: kernels/{repo_id}", "RepoNotFound")
        return repo

    @staticmethod
    def _resolve(repo: _Repo, rev: str) -> str:
        name = rev.removeprefix("refs/heads/")
        if name in repo.branches:
            return repo.branches[name]
        match = re.fullmatch(r"refs/pr/(\d+)", rev)
        if match and int(match.group(1)) in repo.pulls:
            return repo.pulls[int(match.group(1))]
        if _COMMIT_RE.match(rev) and rev in repo.commits:
            return rev
        raise _HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")

    # --- endpoints --------------------------------------------------------------------------

    def create_repo(self, body: dict, authorized: bool) -> dict:
        if not authorized:
            raise _HubError(401, "Invalid credentials in Authorization header")
        if body.get("type") != "kernel":
            raise _HubError(400, f"this test server only hosts kernel repos, not {body.get('type')!r}")
        repo_id = f"{body['organization']}/{body['name']}" if body.get("organization") else body["name"]
        url = f"{self.url}/kernels/{repo_id}"
        if repo_id in self.repos:
            raise _HubError(409, "You already created this kernel repo", extra={"url": url})
        private = body.get("visibility") == "private" or bool(body.get("private"))
        repo = _Repo(repo_id=repo_id, private=private)
        gitattributes = b"*.so filter=lfs diff=lfs merge=lfs -text\n"
        repo.branches["main"] = self._new_commit(repo, None, {".gitattributes": gitattributes}, "initial commit")
        self.repos[repo_id] = repo
        return {"url": url, "name": repo_id}

    def refs(self, repo: _Repo, include_prs: bool) -> dict:
        def ref(name: str, full: str, sha: str) -> dict:
            return {"name": name, "ref": full, "targetCommit": sha}

        out = {
            "branches": [ref(name, f"refs/heads/{name}", sha) for name, sha in sorted(repo.branches.items())],
            "converts": [],
            "tags": [],
        }
        if include_prs:
            out["pullRequests"] = [ref(f"refs/pr/{n}", f"refs/pr/{n}", sha) for n, sha in sorted(repo.pulls.items())]
        return out

    def create_branch(self, repo: _Repo, branch: str, body: dict) -> dict:
        if branch in repo.branches:
            raise _HubError(409, f"Reference already exists: refs/heads/{branch}")
        repo.branches[branch] = self._resolve(repo, body.get("startingPoint") or "main")
        return {}

    def preupload(self, repo: _Repo, rev: str, body: dict) -> dict:
        files = repo.commits[self._resolve(repo, rev)].files
        return {
            "files": [
                {
                    "path": item["path"],
                    "uploadMode": "regular",
                    "shouldIgnore": False,
                    "oid": git_blob_id(files[item["path"]]) if item["path"] in files else None,
                }
                for item in body["files"]
            ]
        }

    def commit(self, repo: _Repo, rev: str, lines: list[dict], create_pr: bool) -> dict:
        if not lines or lines[0].get("key") != "header":
            raise _HubError(400, "the first NDJSON line of a commit must be the header")
        header = lines[0]["value"]
        head = self._resolve(repo, rev)
        if header.get("parentCommit") and header["parentCommit"] != head:
            raise _HubError(412, f"A commit has happened since. Parent commit {header['parentCommit']} is not the head {head} of {rev}")
        files = dict(repo.commits[head].files)
        for line in lines[1:]:
            key, value = line["key"], line["value"]
            path = value["path"]
            if key == "file":
                if value.get("encoding") != "base64":
                    raise _HubError(400, f"unsupported encoding {value.get('encoding')!r}")
                files[path] = base64.b64decode(value["content"])
            elif key == "deletedFile":
                if path not in files:
                    raise _HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
                del files[path]
            elif key == "deletedFolder":
                prefix = path.rstrip("/") + "/"
                for name in [f for f in files if f.startswith(prefix)]:
                    del files[name]
            else:  # lfsFile: preupload never asks for LFS, so a client sending one is a bug
                raise _HubError(400, f"unexpected commit operation {key!r} (this server only takes regular files)")
        sha = self._new_commit(repo, head, files, header.get("summary", ""))
        result = {"success": True, "commitOid": sha, "commitUrl": f"{self.url}/kernels/{repo.repo_id}/commit/{sha}"}
        if create_pr:
            number = max(repo.pulls, default=0) + 1
            repo.pulls[number] = sha
            result["pullRequestUrl"] = f"{self.url}/kernels/{repo.repo_id}/discussions/{number}"
        else:
            name = rev.removeprefix("refs/heads/")
            if name not in repo.branches:
                raise _HubError(400, f"can only commit to a branch, not {rev!r}")
            repo.branches[name] = sha
        return result

    @staticmethod
    def _entries(files: dict[str, bytes], base: str, recursive: bool) -> list[dict]:
        prefix = base.strip("/") + "/" if base.strip("/") else ""
        if prefix and not any(p.startswith(prefix) for p in files) and base.strip("/") not in files:
            raise _HubError(404, f"Entry not found: {base}", "EntryNotFound")
        folders: set[str] = set()
        entries = []
        for path in sorted(files):
            if not path.startswith(prefix):
                continue
            parts = path[len(prefix):].split("/")
            for depth in range(1, len(parts)):
                folder = prefix + "/".join(parts[:depth])
                if (recursive or depth == 1) and folder not in folders:
                    folders.add(folder)
                    entries.append({"type": "directory", "oid": hashlib.sha1(folder.encode()).hexdigest(), "size": 0, "path": folder})
            if recursive or len(parts) == 1:
                entries.append({"type": "file", "oid": git_blob_id(files[path]), "size": len(files[path]), "path": path})
        return entries

    def info(self, repo: _Repo, rev: str) -> dict:
        sha = self._resolve(repo, rev)
        return {
            "id": repo.repo_id,
            "author": repo.repo_id.split("/")[0],
            "sha": sha,
            "private": repo.private,
            "siblings": [{"rfilename": p} for p in sorted(repo.commits[sha].files)],
        }

    def org_overview(self, org: str) -> dict:
        if not any(r.split("/")[0] == org for r in self.repos) and org not in self.trusted_orgs:
            raise _HubError(404, f"Organization {org} not found")
        return {"name": org, "fullname": org, "avatarUrl": "", "trustedKernelPublisher": org in self.trusted_orgs}

    def dispatch(self, method: str, raw_path: str, body: bytes, authorized: bool) -> tuple[int, dict, bytes]:
        """Route one request; returns (status, headers, body)."""
        split = urlsplit(raw_path)
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        parts = [unquote(p) for p in split.path.strip("/").split("/")]
        with self._lock:
            self.requests.append((method, split.path))
            for i, (fail_method, fragment) in enumerate(self._faults):
                if method == fail_method and fragment in split.path:
                    del self._faults[i]
                    return 500, {"X-Error-Message": "injected failure"}, b'{"error": "injected failure"}'
            try:
                return self._route(method, parts, query, body, authorized)
            except _HubError as err:
                headers = {"X-Error-Message": err.message}
                if err.code:
                    headers["X-Error-Code"] = err.code
                return err.status, headers, json.dumps({"error": err.message, **err.extra}).encode()

    def _route(self, method: str, parts: list[str], query: dict, body: bytes, authorized: bool) -> tuple[int, dict, bytes]:
        def ok(payload) -> tuple[int, dict, bytes]:
            return 200, {"Content-Type": "application/json"}, json.dumps(payload).encode()

        def flag(name: str) -> bool:
            return query.get(name, "").lower() in ("1", "true")

        if method == "POST" and parts == ["api", "repos", "create"]:
            return ok(self.create_repo(json.loads(body), authorized))
        if method == "POST" and parts == ["api", "validate-yaml"]:
            return ok({"errors": [], "warnings": []})
        if method == "GET" and parts == ["api", "agent-harnesses"]:  # huggingface_hub's user-agent telemetry
            return ok({"standardEnvVars": [], "harnesses": {}})
        if method == "GET" and len(parts) == 4 and parts[:2] == ["api", "organizations"] and parts[3] == "overview":
            return ok(self.org_overview(parts[2]))
        if len(parts) >= 4 and parts[:2] == ["api", "kernels"]:
            repo = self._repo("/".join(parts[2:4]), authorized)
            rest = parts[4:]
            if method in ("POST", "DELETE") and not authorized:
                raise _HubError(401, "Invalid credentials in Authorization header")
            if method == "GET" and not rest:
                return ok(self.info(repo, "main"))
            if method == "GET" and len(rest) == 2 and rest[0] == "revision":
                return ok(self.info(repo, rest[1]))
            if method == "GET" and rest == ["refs"]:
                return ok(self.refs(repo, flag("include_prs")))
            if method == "POST" and len(rest) == 2 and rest[0] == "branch":
                return ok(self.create_branch(repo, rest[1], json.loads(body or b"{}")))
            if method == "POST" and len(rest) == 2 and rest[0] == "preupload":
                return ok(self.preupload(repo, rest[1], json.loads(body)))
            if method == "POST" and len(rest) == 2 and rest[0] == "commit":
                lines = [json.loads(line) for line in body.splitlines() if line.strip()]
                return ok(self.commit(repo, rest[1], lines, flag("create_pr")))
            if method == "GET" and len(rest) >= 2 and rest[0] == "tree":
                files = repo.commits[self._resolve(repo, rest[1])].files
                return ok(self._entries(files, "/".join(rest[2:]), flag("recursive")))
        if method in ("GET", "HEAD") and len(parts) >= 6 and parts[0] == "kernels" and parts[3] == "resolve":
            repo = self._repo("/".join(parts[1:3]), authorized)
            sha = self._resolve(repo, parts[4])
            path = "/".join(parts[5:])
            files = repo.commits[sha].files
            if path not in files:
                raise _HubError(404, f"Entry not found: {path}", "EntryNotFound")
            data = files[path]
            headers = {
                "Content-Type": "application/octet-stream",
                "X-Repo-Commit": sha,
                "ETag": f'"{git_blob_id(data)}"',
                "Content-Length": str(len(data)),
            }
            return 200, headers, b"" if method == "HEAD" else data
        self.unhandled.append((method, "/".join(parts)))
        raise _HubError(404, f"test hub server: no route for {method} /{'/'.join(parts)}")


def _make_handler(server: HubServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while True:
                    size = int(self.rfile.readline().strip() or b"0", 16)
                    if size == 0:
                        self.rfile.readline()
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _handle(self) -> None:
            body = self._body()
            authorized = bool(self.headers.get("Authorization", "").removeprefix("Bearer ").strip())
            status, headers, payload = server.dispatch(self.command, self.path, body, authorized)
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            if "Content-Length" not in headers:
                self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        do_GET = do_POST = do_HEAD = do_DELETE = _handle

        def log_message(self, format, *args):  # noqa: A002 - the stdlib's signature
            pass

    return Handler
