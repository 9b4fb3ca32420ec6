"""``triton-collection``: thin subcommands over the library functions.

    triton-collection build [--package NAME ...] [--out DIR] [--org ORG] [--cpu-variant]
    triton-collection install-local [--org ORG] [--package NAME ...] [--out DIR]
    triton-collection demo [--prompt TEXT] [--model DIR] [--device DEV]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from . import DEFAULT_ORG

__all__ = ["main"]


def _find_root(start: Path) -> Path:
    for folder in (start, *start.parents):
        if (folder / "build.toml").is_file() and (folder / "torch-ext").is_dir():
            return folder
    raise SystemExit(f"no collection build.toml (with torch-ext/ beside it) in {start} or above; pass --root")


def _collection(args):
    from .manifest import load_manifest

    return load_manifest(Path(args.root) if args.root else _find_root(Path.cwd()))


def _cmd_build(args) -> int:
    from .build import build_collection

    collection = _collection(args)
    out = Path(args.out) if args.out else collection.root / "dist" / "hub"
    built = build_collection(collection, out, org=args.org, packages=args.package, cpu_variant=args.cpu_variant)
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
    built = build_collection(collection, out, org=org, packages=args.package, cpu_variant=True)
    installed = [install_local(b, org=org) for b in built]
    rows = [{"repo_id": i.repo_id, "version": i.version, "commit": i.commit, "snapshot": str(i.snapshot)} for i in installed]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            print(f"{r['repo_id']} v{r['version']} -> revision {r['commit']}")
            print(f"  load: HF_HUB_OFFLINE=1 python -c \"import kernels; kernels.get_kernel('{r['repo_id']}', version={r['version']})\"")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="triton-collection", description=__doc__.split("\n\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p):
        p.add_argument("--root", help="collection folder (default: the one holding build.toml above the cwd)")
        p.add_argument("--package", action="append", help="Hub name of a package (repeat; default: all)")
        p.add_argument("--out", help="output folder (default: <root>/dist/hub; install-local: <root>/dist/local/<org>)")
        p.add_argument("--org", help=f"Hub organisation (default: build.toml's, {DEFAULT_ORG})")
        p.add_argument("--json", action="store_true", help="print the result as JSON")

    build = sub.add_parser("build", help="render each package's Hub tree under dist/hub/")
    common(build)
    build.add_argument("--cpu-variant", action="store_true", help="also write build/torch-cpu (local test builds)")
    build.set_defaults(func=_cmd_build)

    install = sub.add_parser("install-local", help="build and lay the packages into the HF cache, loadable by Hub name")
    common(install)
    install.set_defaults(func=_cmd_install_local)

    from . import demo

    demo.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
