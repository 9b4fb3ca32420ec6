"""Publish rendered packages to the Hugging Face Kernels Hub, the way kernel-builder lays them out.

For each package, with ``huggingface_hub.HfApi`` (``HF_ENDPOINT`` or ``endpoint=`` picks the server;
the token is read the usual way: ``HF_TOKEN``, then ``hf auth login``'s file):

1. create the repo ``<org>/<name>`` as ``repo_type="kernel"`` (``exist_ok``; ``private`` only
   applies when it is created);
2. create the branch ``v<version>`` from ``main`` when it is missing;
3. in **one commit** on ``v<version>``: every file of ``build/torch-<backend>/`` for each backend
   and ``benchmarks/benchmark*.py`` that is new or changed, and the deletion of files under those
   variants (and of benchmark files) that the new build no longer has. The commit names the branch
   head it was planned against (``parent_commit``), so a concurrent publish makes it fail instead
   of being overwritten;
4. the card as ``README.md`` on ``main`` — last, so ``main`` never advertises a build that is not
   there, and only when no newer version branch exists.

Every step is idempotent (unchanged files are not sent, an up-to-date branch gets no commit), so a
publish that failed half-way is repaired by running it again.

Versioning rules (kernel-builder's "kernel requirements"), checked against what the branch already
holds before anything is written:

- our packages are noarch: one publish replaces *every* build variant of the branch. A variant on
  the branch that this publish does not carry would be left on older code, so it is refused;
- the public API may grow within a version but nothing published may be removed or changed
  (``__all__`` names, function signatures, layer names, layer ``forward`` signatures; see
  :mod:`triton_collection.api_surface`). Such a publish is refused with a message to bump the
  major version. The published API is read from the branch's own files (parsed, not imported).

Published builds never carry ``torch-cpu``; ``cpu_variant=True`` exists for tests only (a CPU-only
consumer cannot load a cuda/rocm/xpu variant) and the CLI does not offer it.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath

from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, constants
from huggingface_hub.errors import RepositoryNotFoundError
from huggingface_hub.hf_api import RepoFile
from huggingface_hub.utils import get_token
from huggingface_hub.utils.sha import git_hash

from .api_surface import breaking_changes, read_surface, surface_of_dir
from .build import BuiltPackage, build_collection
from .manifest import Collection, check_org

__all__ = ["PublishError", "PublishPlan", "PublishResult", "execute_plan", "plan_publish", "publish_collection"]

log = logging.getLogger(__name__)

REPO_TYPE = "kernel"


class PublishError(RuntimeError):
    """A publish step failed or was refused; the message names the repo and the step."""

    def __init__(self, repo_id: str, step: str, message: str):
        super().__init__(f"{repo_id}: {step}: {message}")
        self.repo_id = repo_id
        self.step = step


@contextlib.contextmanager
def _step(repo_id: str, step: str):
    try:
        yield
    except PublishError:
        raise
    except Exception as err:  # any client/server error: say where it happened
        raise PublishError(repo_id, step, f"{type(err).__name__}: {err}") from err


@dataclass(frozen=True)
class PublishPlan:
    """What a publish of one package will do; :meth:`describe` prints it (``--dry-run``).

    Attributes:
        repo_id: ``<org>/<name>``.
        version: major version; the branch is ``v<version>``.
        tree: the rendered Hub tree the files come from.
        variants: the ``build/`` variants uploaded, e.g. ``("torch-cuda", "torch-rocm", "torch-xpu")``.
        repo_exists: False when the repo will be created.
        branch_head: commit of ``v<version>`` when planned; None when the branch will be created.
        added, changed, unchanged, deleted: paths on the branch, by what the commit does to them.
        card: ``"add"``, ``"update"``, ``"unchanged"`` or ``"skip"`` (a newer version branch exists).
        newest_version: highest ``v<N>`` branch on the Hub when planned (0 if none).
        private, create_pr: the options.
    """

    repo_id: str
    version: int
    tree: Path
    variants: tuple[str, ...]
    repo_exists: bool
    branch_head: str | None
    added: tuple[str, ...]
    changed: tuple[str, ...]
    unchanged: tuple[str, ...]
    deleted: tuple[str, ...]
    card: str
    newest_version: int = 0
    private: bool = False
    create_pr: bool = False

    @property
    def branch(self) -> str:
        return f"v{self.version}"

    @property
    def build_up_to_date(self) -> bool:
        return self.branch_head is not None and not (self.added or self.changed or self.deleted)

    def describe(self) -> str:
        """The plan as text: repo, branch, files added/changed/deleted, the card."""
        how = "as pull requests" if self.create_pr else "directly"
        lines = [
            f"{self.repo_id} ({'exists' if self.repo_exists else 'create, ' + ('private' if self.private else 'public')}), {how}",
            f"  branch {self.branch}: " + (f"at {self.branch_head[:12]}" if self.branch_head else "create from main"),
            f"  variants: {', '.join(self.variants)}",
        ]
        if self.build_up_to_date:
            lines.append(f"  build: up to date ({len(self.unchanged)} files), no commit")
        else:
            count = len(self.added) + len(self.changed) + len(self.deleted)
            lines.append(f"  one commit on {self.branch}, {count} change(s), {len(self.unchanged)} file(s) unchanged:")
            lines += [f"    + {p}" for p in self.added]
            lines += [f"    ~ {p}" for p in self.changed]
            lines += [f"    - {p}" for p in self.deleted]
        card = {
            "add": "add",
            "update": "update",
            "unchanged": "unchanged",
            "skip": f"left as is (v{self.newest_version} is newer)",
        }[self.card]
        lines.append(f"  card README.md on main: {card}")
        return "\n".join(lines)

    def as_dict(self) -> dict:
        data = asdict(self)
        data["tree"] = str(self.tree)
        data["branch"] = self.branch
        return data


@dataclass(frozen=True)
class PublishResult:
    """What a publish did: the head of the version branch after it, and the commits it made."""

    repo_id: str
    branch: str
    commit: str | None
    build_commit: str | None = None
    card_commit: str | None = None
    pull_requests: tuple[str, ...] = field(default_factory=tuple)


def _local_files(built: BuiltPackage) -> dict[str, Path]:
    """Branch path -> local file: every file of each build variant, and the benchmark scripts."""
    files = {}
    for backend in built.backends:
        variant = built.variant(backend)
        for path in sorted(p for p in variant.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            files[path.relative_to(built.path).as_posix()] = path
    for path in sorted((built.path / "benchmarks").glob("benchmark*.py")):
        files[f"benchmarks/{path.name}"] = path
    return files


def _is_ours(path: str, variants: tuple[str, ...]) -> bool:
    """Whether a branch file belongs to what a publish replaces (uploaded variants, benchmark scripts)."""
    p = PurePosixPath(path)
    if len(p.parts) > 2 and p.parts[0] == "build" and p.parts[1] in variants:
        return True
    return str(p.parent) == "benchmarks" and p.name.startswith("benchmark") and p.suffix == ".py"


def _published_surfaces(api: HfApi, repo_id: str, head: str, variants: set[str]) -> dict[str, object]:
    """API surface of each published variant, from the branch's own ``.py`` files."""
    with tempfile.TemporaryDirectory(prefix="triton-collection-published-") as tmp:
        snapshot = Path(
            api.snapshot_download(repo_id, repo_type=REPO_TYPE, revision=head, allow_patterns=["build/*.py"], cache_dir=tmp)
        )
        surfaces = {}
        for variant in sorted(variants):
            folder = snapshot / "build" / variant
            files = {p.relative_to(folder).as_posix(): p.read_text(encoding="utf-8") for p in folder.rglob("*.py")}
            if "__init__.py" in files:
                surfaces[variant] = read_surface(files)
        return surfaces


def plan_publish(api: HfApi, built: BuiltPackage, *, org: str, private: bool = False, create_pr: bool = False) -> PublishPlan:
    """Compare a rendered package with its Hub repo and decide what a publish does. Only reads.

    Raises:
        PublishError: the versioning rules refuse the publish (a variant left on older code, or
            a removed/changed public API within the version), or the Hub could not be read.
    """
    package = built.package
    repo_id = f"{org}/{package.name}"
    branch = f"v{package.version}"
    variants = tuple(f"torch-{b}" for b in built.backends)
    local = _local_files(built)

    with _step(repo_id, "read refs"):
        try:
            refs = api.list_repo_refs(repo_id, repo_type=REPO_TYPE)
            repo_exists = True
        except RepositoryNotFoundError:
            refs, repo_exists = None, False
    heads = {b.name: b.target_commit for b in refs.branches} if refs else {}
    versions = [int(name[1:]) for name in heads if name[:1] == "v" and name[1:].isdigit()]
    newest = max(versions, default=0)
    head = heads.get(branch)

    remote: dict[str, str] = {}
    if head is not None:
        with _step(repo_id, f"list files of {branch}"):
            remote = {
                f.path: f.blob_id
                for f in api.list_repo_tree(repo_id, repo_type=REPO_TYPE, revision=head, recursive=True)
                if isinstance(f, RepoFile)
            }
    published = {PurePosixPath(p).parts[1] for p in remote if p.startswith("build/") and len(PurePosixPath(p).parts) > 2}

    stale = sorted(published - set(variants))
    if stale:
        raise PublishError(
            repo_id,
            "check versioning rules",
            f"{branch} holds build variant(s) {', '.join(stale)} that this publish does not carry ({', '.join(variants)}). "
            "The package is noarch: a publish replaces every variant at once, and leaving these on older code is "
            "not allowed. Publish them too, or publish to a new major version "
            f"(version = {package.version + 1} in [package.{package.name}] of build.toml).",
        )

    added, changed, unchanged = [], [], []
    for path, file in local.items():
        oid = remote.get(path)
        if oid is None:
            added.append(path)
        elif oid != git_hash(file.read_bytes()):
            changed.append(path)
        else:
            unchanged.append(path)
    deleted = sorted(p for p in remote if _is_ours(p, variants) and p not in local)

    if published and (added or changed or deleted):  # an unchanged build changes no API
        log.info("%s: reading the API published on %s to check the versioning rules", repo_id, branch)
        with _step(repo_id, f"read the API published on {branch}"):
            surfaces = _published_surfaces(api, repo_id, head, published)
        new_surface = surface_of_dir(built.variant(built.backends[0]))
        problems = sorted({p for old in surfaces.values() for p in breaking_changes(old, new_surface)})
        if problems:
            raise PublishError(
                repo_id,
                "check versioning rules",
                f"this build removes or changes API already published on {branch}:\n  - "
                + "\n  - ".join(problems)
                + f"\nWithin a version only additions are allowed. Bump the major version: set version = "
                f"{package.version + 1} in [package.{package.name}] of build.toml and publish again "
                f"(that creates v{package.version + 1}; {branch} stays as it is for its users).",
            )

    card = "add"
    if newest > package.version:
        card = "skip"
    elif repo_exists:
        with _step(repo_id, "read the card on main"):
            main = {f.path: f.blob_id for f in api.list_repo_tree(repo_id, repo_type=REPO_TYPE, revision="main") if isinstance(f, RepoFile)}
        card_oid = git_hash((built.path / "README.md").read_bytes())
        card = "add" if "README.md" not in main else "unchanged" if main["README.md"] == card_oid else "update"

    return PublishPlan(
        repo_id=repo_id,
        version=package.version,
        tree=built.path,
        variants=variants,
        repo_exists=repo_exists,
        branch_head=head,
        added=tuple(added),
        changed=tuple(changed),
        unchanged=tuple(unchanged),
        deleted=tuple(deleted),
        card=card,
        newest_version=newest,
        private=private,
        create_pr=create_pr,
    )


def execute_plan(api: HfApi, plan: PublishPlan, *, source_hash: str = "") -> PublishResult:
    """Carry out a plan from :func:`plan_publish`. See the module docstring for the steps.

    Raises:
        PublishError: naming the repo and the step that failed. Running the same publish again
            continues from where it stopped.
    """
    repo_id, branch = plan.repo_id, plan.branch
    if not (api.token or get_token()):
        raise PublishError(repo_id, "authenticate", "no Hugging Face token: run `hf auth login` or set HF_TOKEN")
    prs: list[str] = []

    log.info("%s [1/4] create repo (kernel, exist_ok)", repo_id)
    with _step(repo_id, "create repo"):
        api.create_repo(repo_id, repo_type=REPO_TYPE, private=plan.private, exist_ok=True)

    parent = plan.branch_head
    if parent is None:
        log.info("%s [2/4] create branch %s from main", repo_id, branch)
        with _step(repo_id, f"create branch {branch}"):
            api.create_branch(repo_id, branch=branch, repo_type=REPO_TYPE, exist_ok=True)
            parent = next(b.target_commit for b in api.list_repo_refs(repo_id, repo_type=REPO_TYPE).branches if b.name == branch)
    else:
        log.info("%s [2/4] branch %s exists at %s", repo_id, branch, parent[:12])

    build_commit = None
    if plan.added or plan.changed or plan.deleted:
        count = len(plan.added) + len(plan.changed) + len(plan.deleted)
        log.info("%s [3/4] commit %d change(s) to %s (%s)", repo_id, count, branch, ", ".join(plan.variants))
        operations = [CommitOperationAdd(path_in_repo=p, path_or_fileobj=str(plan.tree / p)) for p in (*plan.added, *plan.changed)]
        operations += [CommitOperationDelete(path_in_repo=p) for p in plan.deleted]
        message = f"Build {plan.repo_id.split('/')[1]} v{plan.version} ({', '.join(plan.variants)})"
        with _step(repo_id, f"commit the build to {branch}"):
            info = api.create_commit(
                repo_id,
                operations,
                commit_message=message + (f" from source {source_hash}" if source_hash else ""),
                repo_type=REPO_TYPE,
                revision=branch,
                parent_commit=parent,
                create_pr=plan.create_pr,
            )
        build_commit = info.oid
        if info.pr_url:
            prs.append(info.pr_url)
    else:
        log.info("%s [3/4] %s is up to date, no commit", repo_id, branch)

    card_commit = None
    if plan.card in ("add", "update"):
        log.info("%s [4/4] upload the card README.md to main", repo_id)
        with _step(repo_id, "upload the card to main"):
            info = api.create_commit(
                repo_id,
                [CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=str(plan.tree / "README.md"))],
                commit_message=f"Card for v{plan.version}",
                repo_type=REPO_TYPE,
                revision="main",
                create_pr=plan.create_pr,
            )
        card_commit = info.oid
        if info.pr_url:
            prs.append(info.pr_url)
    else:
        log.info("%s [4/4] card: %s", repo_id, "unchanged" if plan.card == "unchanged" else f"v{plan.newest_version} is newer, left as is")

    head = parent if plan.create_pr else (build_commit or parent)
    return PublishResult(repo_id=repo_id, branch=branch, commit=head, build_commit=build_commit, card_commit=card_commit, pull_requests=tuple(prs))


def publish_collection(
    collection: Collection,
    *,
    org: str,
    packages: list[str] | None = None,
    dry_run: bool = False,
    private: bool = False,
    create_pr: bool = False,
    endpoint: str | None = None,
    out: Path | None = None,
    cpu_variant: bool = False,
) -> list[tuple[PublishPlan, PublishResult | None]]:
    """Build each package (without the cpu variant) and publish it; ``dry_run`` only plans.

    Args:
        collection: the parsed manifest.
        org: Hub organisation.
        packages: Hub names to publish (default: all).
        dry_run: plan and return; nothing on the Hub is written.
        private: create new repos private.
        create_pr: open pull requests instead of committing to the branches.
        endpoint: Hub URL (default: ``HF_ENDPOINT`` or huggingface.co).
        out: where the trees are rendered (default ``<root>/dist/hub``).
        cpu_variant: tests only: also publish ``build/torch-cpu``.

    Returns:
        ``(plan, result)`` per package; ``result`` is None on a dry run.

    Raises:
        PublishError: the build is refused or cannot be written, a package's plan is refused (then nothing is
            written), or a publish step fails (packages before it are published; running again finishes the rest).
    """
    try:
        check_org(org)
    except ValueError as err:
        raise PublishError(str(org), "check org", str(err)) from None
    if constants.is_offline_mode():
        raise PublishError(org, "connect", "HF_HUB_OFFLINE is set: publishing needs the Hub")
    api = HfApi(endpoint=endpoint)
    try:
        built = build_collection(collection, Path(out) if out else collection.root / "dist" / "hub", org=org, packages=packages, cpu_variant=cpu_variant)
    except (ValueError, OSError) as err:  # a layer breaking the kernels rules, an --out that is a file, ...: nothing sent
        raise PublishError(org, "build", str(err)) from None
    # plan every package before writing anything: a refused package stops the whole publish
    plans = [(b, plan_publish(api, b, org=org, private=private, create_pr=create_pr)) for b in built]
    for _, plan in plans:
        log.debug("plan:\n%s", plan.describe())
    if dry_run:
        return [(plan, None) for _, plan in plans]
    return [(plan, execute_plan(api, plan, source_hash=b.source_hash)) for b, plan in plans]
