"""``benchmarks/variant_tree.py``: the edited copy of the checkout that ``ab_sweep.py`` times against it."""

import importlib.util
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("variant_tree", ROOT / "benchmarks" / "variant_tree.py")
variant_tree = importlib.util.module_from_spec(spec)
spec.loader.exec_module(variant_tree)


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    (root / "src").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "src" / "k.py").write_text("a = 1\nb = 1\n")
    (root / "tests" / "t.py").write_text("x\n")
    (root / "ignored.txt").write_text("no\n")
    (root / ".gitignore").write_text("ignored.txt\n")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    return root


def test_copies_and_edits(repo, tmp_path):
    out = tmp_path / "v"
    edited = variant_tree.make_variant(out, [("src/k.py", "= 1", "= 2", 2)], root=repo)
    assert edited == ["src/k.py"]
    assert (out / "src" / "k.py").read_text() == "a = 2\nb = 2\n"
    assert (repo / "src" / "k.py").read_text() == "a = 1\nb = 1\n"  # the checkout is untouched
    assert not (out / "tests").exists() and not (out / "ignored.txt").exists() and (out / ".gitignore").exists()


def test_a_miscounted_edit_writes_nothing(repo, tmp_path, capsys):
    out = tmp_path / "v"
    with pytest.raises(ValueError, match="occurs 2 times, expected 1"):
        variant_tree.make_variant(out, [("src/k.py", "= 1", "= 2", 1)], root=repo)
    assert not out.exists()
    # the CLI, on this checkout: an edit that matches nothing
    assert variant_tree.main([str(out), "--edit", "benchmarks/variant_tree.py", "NO SUCH TEXT", "x"]) == 1
    assert "occurs 0 times, expected 1" in capsys.readouterr().err and not out.exists()


def test_escapes_and_existing_folder(repo, tmp_path):
    out = tmp_path / "v"
    _, edits = variant_tree.parse([str(out), "--edit", "src/k.py", "a = 1\\nb", "a = 3\\nb"])
    assert edits == [("src/k.py", "a = 1\nb", "a = 3\nb", 1)]
    variant_tree.make_variant(out, edits, root=repo)
    assert (out / "src" / "k.py").read_text() == "a = 3\nb = 1\n"
    with pytest.raises(ValueError, match="exists"):
        variant_tree.make_variant(out, [], root=repo)
