"""``triton-collection``: thin subcommands over the library functions.

    triton-collection build [--package NAME ...] [--out DIR] [--org ORG] [--cpu-variant]
    triton-collection install-local [--org ORG] [--package NAME ...] [--out DIR]
    triton-collection publish --org ORG [--package NAME ...] [--dry-run] [--private] [--create-pr] [--endpoint URL]
    triton-collection demo [--prompt TEXT] [--model DIR] [--device DEV]
    triton-collection port-check FIXTURE [FIXTURE ...] [--kernel NAME] [--dtype D] [--json] [--out FILE] [--validate]
    triton-collection bench [PACKAGE ...] [--shapes quick|full] [--dtype bf16] [--out DIR] [--e2e MODEL ...]
    triton-collection tune [--shape M,N,K ...] [--candidates FILE] [--out FILE] [--budget-s S]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from . import DEFAULT_ORG
from .argtypes import hub_org

__all__ = ["main"]


def _find_root(start: Path) -> Path:
    for folder in (start, *start.parents):
        if (folder / "build.toml").is_file() and (folder / "torch-ext").is_dir():
            return folder
    raise SystemExit(f"no collection build.toml (with torch-ext/ beside it) in {start} or above; pass --root")


def _collection(args):
    """The collection of ``--root`` (or the checkout around the working folder), its ``--package`` names checked:
    a missing or invalid build.toml or an unknown package ends the command with one line naming it (no traceback)."""
    from .manifest import load_manifest

    root = Path(args.root) if args.root else _find_root(Path.cwd())
    if not (root / "build.toml").is_file():
        raise SystemExit(f"--root {root}: no build.toml there (a collection checkout holds build.toml and torch-ext/)")
    try:
        collection = load_manifest(root)
    except ValueError as err:  # not TOML, a bad [package.*] table (tomllib's error is a ValueError too)
        raise SystemExit(f"{root / 'build.toml'}: {err}") from None
    for name in getattr(args, "package", None) or ():
        try:
            collection.package(name)
        except KeyError as err:
            raise SystemExit(f"--package: {err.args[0]}") from None
    return collection


def _cmd_build(args) -> int:
    from .build import build_collection

    collection = _collection(args)
    out = Path(args.out) if args.out else collection.root / "dist" / "hub"
    try:
        built = build_collection(collection, out, org=args.org, packages=args.package, cpu_variant=args.cpu_variant)
    except (ValueError, OSError) as err:  # a tree the build refuses (a layer breaking the kernels rules, ...): nothing
        print(f"build failed: {err}", file=sys.stderr)  # written; or an --out that is a file / not writable
        return 1
    rows = [{"package": b.package.name, "version": b.package.version, "path": str(b.path), "backends": list(b.backends)} for b in built]
    print(json.dumps(rows, indent=2) if args.json else "\n".join(f"{r['package']} v{r['version']}: {r['path']} ({', '.join(r['backends'])})" for r in rows))
    return 0


def _cmd_install_local(args) -> int:
    from .build import build_collection
    from .install import install_local

    collection = _collection(args)
    org = args.org or collection.org
    # local builds carry the cpu variant: keep them apart from the publishable dist/hub trees
    out = Path(args.out) if args.out else collection.root / "dist" / "local" / org
    try:
        built = build_collection(collection, out, org=org, packages=args.package, cpu_variant=True)
        installed = [install_local(b, org=org) for b in built]
    except (ValueError, OSError) as err:  # OSError: an --out or cache folder that is a file or not writable
        print(f"install-local failed: {err}", file=sys.stderr)
        return 1
    rows = [{"repo_id": i.repo_id, "version": i.version, "commit": i.commit, "snapshot": str(i.snapshot)} for i in installed]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            print(f"{r['repo_id']} v{r['version']} -> revision {r['commit']}")
            print(f"  load: HF_HUB_OFFLINE=1 python -c \"import kernels; kernels.get_kernel('{r['repo_id']}', version={r['version']})\"")
    return 0


# publish steps that fail before anything is sent to the Hub, and fail again unchanged when rerun
_REFUSED_BEFORE_WRITING = ("check org", "connect", "build", "check versioning rules", "authenticate")
# the reads that plan every package before the first write (publish.plan_publish): a failure there wrote nothing
_PLANNING = ("read refs", "list files of ", "read the API published on ", "read the card on main")


def _cmd_publish(args) -> int:
    from .publish import PublishError, publish_collection

    if not args.verbose:  # one line per HTTP request is for -v
        logging.getLogger("httpx2").setLevel(logging.WARNING)
    collection = _collection(args)
    try:
        done = publish_collection(collection, org=args.org, packages=args.package, dry_run=args.dry_run, private=args.private,
                                  create_pr=args.create_pr, endpoint=args.endpoint, out=Path(args.out) if args.out else None)
    except PublishError as err:
        print(f"publish failed: {err}", file=sys.stderr)
        if args.dry_run and err.step not in ("check org", "build"):  # the plan reads the Hub's branches too
            print("A dry run reads the Hub's current version branches to plan; nothing was written.", file=sys.stderr)
        elif err.step.startswith(_PLANNING):  # not "to finish": nothing was started
            print("The Hub is read to plan every package before the first write: nothing was written.", file=sys.stderr)
        elif err.step not in _REFUSED_BEFORE_WRITING:  # a refusal before writing fails again the same way
            print("Every step is idempotent: run the same command again to finish.", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([{"plan": plan.as_dict(), "result": result and vars(result)} for plan, result in done], indent=2))
        return 0
    for plan, result in done:
        print(("dry run, nothing written: " if args.dry_run else "") + plan.describe())
        if result is not None:
            print(f"  published: {result.branch} at {result.commit}" + "".join(f"\n  pull request: {u}" for u in result.pull_requests))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="triton-collection", description=__doc__.split("\n\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p, *, out_default: str = "dist/hub", org_required: bool = False):
        p.add_argument("--root", help="collection folder (default: the one holding build.toml above the cwd)")
        p.add_argument("--package", action="append",
                       help="a package by Hub, Python or short name (triton-norms, triton_norms, norms); repeat; default: all")
        p.add_argument("--out", help=f"output folder (default: <root>/{out_default})")
        p.add_argument("--org", type=hub_org, required=org_required,
                       help="Hub organisation" + ("" if org_required else f" (default: build.toml's, {DEFAULT_ORG})"))
        p.add_argument("--json", action="store_true", help="print the result as JSON")

    build = sub.add_parser("build", help="render each package's Hub tree under dist/hub/",
                           description="Render each package's Hub tree under dist/hub/.")
    common(build)
    build.add_argument("--cpu-variant", action="store_true", help="also write build/torch-cpu (local test builds)")
    build.set_defaults(func=_cmd_build)

    install = sub.add_parser("install-local", help="build and lay the packages into the HF cache, loadable by Hub name",
                             description="Build and lay the packages into the HF cache, loadable by Hub name.")
    common(install, out_default="dist/local/<org>")
    install.set_defaults(func=_cmd_install_local)

    publish = sub.add_parser("publish", help="build and upload the packages to the Kernels Hub (branch v<version>)",
                             description="Build and upload the packages to the Kernels Hub (branch v<version>).")
    common(publish, org_required=True)
    publish.add_argument("--dry-run", action="store_true", help="print the plan (repo, branch, files added/changed/deleted); write nothing")
    publish.add_argument("--private", action="store_true", help="create new repos private (existing repos keep their visibility)")
    publish.add_argument("--create-pr", action="store_true", help="open pull requests instead of committing to the branches")
    publish.add_argument("--endpoint", help="Hub URL (default: $HF_ENDPOINT or https://huggingface.co)")
    publish.set_defaults(func=_cmd_publish)

    from . import demo, tune

    demo.add_parser(sub)
    from . import port_check

    port_check.add_parser(sub)
    tune.add_parser(sub)
    from . import bench

    bench.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
