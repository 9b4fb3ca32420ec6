"""A copy of this checkout with literal source edits: the "new" side of an ``ab_sweep.py`` A/B.

    python3 benchmarks/variant_tree.py OUT_DIR --edit FILE 'OLD' 'NEW' [COUNT] [--edit ...]

Copies the files git tracks here and the untracked ones it does not ignore (the working tree as it is), less
``benchmarks/results``, ``docs`` and ``tests`` (the device tool carries at most 64 MiB), into ``OUT_DIR`` (which
must not exist), then in each ``FILE`` (a path relative to the checkout) replaces ``OLD`` by ``NEW``. ``OLD`` must
occur exactly ``COUNT`` times (default 1), else nothing is written and the script exits 1: a silent no-op edit
would time the base against itself. Python escapes (``\\n``) in OLD / NEW are decoded.

Then, on the GPU: ``cd OUT_DIR && python3 benchmarks/ab_sweep.py --base <this checkout> --out DIR --cases ...``.
Session 22 made its eviction-hint variants this way (``benchmarks/NOTES.md``).
"""

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = ("benchmarks/results/", "docs/", "tests/")


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--edit", nargs="+", action="append", default=[], metavar="FILE OLD NEW [COUNT]",
                    help="replace OLD by NEW in FILE; OLD must occur COUNT times (default 1)")
    args = ap.parse_args(argv)
    edits = []
    for e in args.edit:
        if len(e) not in (3, 4):
            ap.error(f"--edit takes FILE OLD NEW [COUNT], got {len(e)} values")
        decode = lambda s: s.encode("utf-8").decode("unicode_escape")  # noqa: E731
        edits.append((e[0], decode(e[1]), decode(e[2]), int(e[3]) if len(e) == 4 else 1))
    return args.out, edits


def make_variant(out: Path, edits, root: Path = ROOT) -> list:
    """Copies the checkout at ``root`` to ``out`` and applies ``edits`` ((file, old, new, count), ...); returns
    the edited paths. Raises ValueError (before writing anything) when an OLD does not occur COUNT times."""
    if out.exists():
        raise ValueError(f"{out} exists: pick a new folder")
    texts = {}
    for name, old, new, count in edits:
        text = texts[name] if name in texts else (root / name).read_text(encoding="utf-8")
        if text.count(old) != count:
            raise ValueError(f"{name}: {old!r} occurs {text.count(old)} times, expected {count}")
        texts[name] = text.replace(old, new)
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        src = root / name
        if name.startswith(SKIP) or not src.is_file():
            continue
        dst = out / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(src.read_bytes())
    for name, text in texts.items():
        (out / name).write_text(text, encoding="utf-8")
    return sorted(texts)


def main(argv=None) -> int:
    out, edits = parse(argv)
    try:
        edited = make_variant(out, edits)
    except ValueError as exc:
        print(f"variant_tree: {exc}", file=sys.stderr)
        return 1
    print(f"{out}: {len(edited)} file(s) edited: {', '.join(edited) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
