"""Hub trees, metadata/digests, the rendered build.toml, and loading by name from the cache."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import kernels
import kernels_data
import pytest
from kernels._rust import Build  # kernels' own build.toml parser (the one kernel-builder shares)

from triton_collection.build import BACKENDS
from triton_collection.manifest import load_manifest, render_package_build_toml

from .conftest import ORG, ROOT


def test_every_manifest_package_has_a_source_folder():
    collection = load_manifest(ROOT)
    assert [p.name for p in collection.packages][0] == "triton-norms"
    for pkg in collection.packages:
        assert (ROOT / "torch-ext" / pkg.python_name / "__init__.py").is_file()


def test_rendered_build_toml_is_valid_edition_5_noarch(built):
    for b in built.values():
        text = (b.path / "build.toml").read_text()
        assert "edition = 5" in text and "[torch-noarch]" in text and "[kernel." not in text
        parsed = Build.open(b.path)  # raises on any field kernel-builder does not know
        assert [str(x).lower() for x in parsed.general.backends] == list(BACKENDS) + ["cpu"]


def test_published_build_toml_has_no_cpu_backend():
    collection = load_manifest(ROOT)
    text = render_package_build_toml(collection, collection.packages[0], org=ORG, backends=list(BACKENDS))
    assert 'backends = ["cuda", "rocm", "xpu"]' in text
    assert f'repo-id = "{ORG}/triton-norms"' in text


def test_hub_tree_layout(built):
    b = built["triton-norms"]
    for rel in ("build.toml", "flake.nix", "README.md", "torch-ext/triton_norms/__init__.py"):
        assert (b.path / rel).is_file(), rel
    assert sorted(p.name for p in (b.path / "build").iterdir()) == ["torch-cpu", "torch-cuda", "torch-rocm", "torch-xpu"]
    card = (b.path / "README.md").read_text()
    assert "rms_norm" in card and "LlamaRMSNorm" in card


def test_card_benchmark_command_runs_as_written(built, monkeypatch, tmp_path):
    """The card's `kernels benchmark` line reaches the download of the package's v1 (kernels 0.17.2 stops a Hub repo
    id given without a version or branch: "must specify either branch or version")."""
    import shlex

    from kernels.cli import benchmark

    card = (built["triton-norms"].path / "README.md").read_text()
    line = re.search(r"`(kernels benchmark [^`]+)`", card).group(1)
    argv = shlex.split(line)[2:]
    repo_id = argv[0]
    version = int(argv[argv.index("--version") + 1]) if "--version" in argv else None
    branch = argv[argv.index("--branch") + 1] if "--branch" in argv else None
    asked = []

    class _Api:
        def snapshot_download(self, repo_id, revision):
            asked.append((repo_id, revision))
            raise KeyboardInterrupt  # stop here: the command line was accepted

    monkeypatch.setattr(benchmark, "_get_hf_api", lambda: _Api())
    monkeypatch.chdir(tmp_path)  # no local folder named like the repo id
    with pytest.raises(KeyboardInterrupt):
        benchmark.run_benchmark(repo_id, branch, version)
    assert asked == [(f"{ORG}/triton-norms", "v1")]


def test_lockfile_route_loads_an_install_local_build_offline(installed, tmp_path):
    """README: offline, `load_kernel(lockfile=...)` skips the publisher check (as `get_kernel` does), so a locked
    `install-local` build of an organisation that is not a trusted publisher loads."""
    import torch
    import torch.nn.functional as F

    pkg = installed["triton-norms"]
    lock = tmp_path / "kernels.lock"
    lock.write_text(json.dumps([{"dependency": {"repo-id": pkg.repo_id, "version": pkg.version},
                                 "lock": {"commit": pkg.commit}}]))
    mod = kernels.load_kernel(pkg.repo_id, lockfile=lock)
    assert Path(mod.__file__).resolve().is_relative_to(pkg.snapshot.resolve())
    x = torch.randn(3, 8)
    w = torch.randn(8)
    torch.testing.assert_close(mod.rms_norm(x, w, eps=1e-6), F.rms_norm(x.double(), (8,), w.double(), 1e-6).float())


@pytest.mark.parametrize("backend", ["cpu", "cuda", "rocm", "xpu"])
def test_metadata_and_digest(built, backend):
    b = built["triton-norms"]
    variant = b.variant(backend)
    raw = json.loads((variant / "metadata.json").read_text())
    assert raw["id"] == f"_triton_norms_{backend}_{b.source_hash}"
    assert raw["backend"]["type"] == backend and raw["python-depends"] == []
    metadata = kernels_data.Metadata.read_from_file(variant / "metadata.json")
    assert metadata.version == 1 and str(metadata.name) == "triton-norms"
    metadata.digest.validate(kernels_data.Digest.hash_variant(kernels_data.DigestAlgorithm.SHA256, variant))
    ops_py = (variant / "_ops.py").read_text()
    assert f'NAMESPACE = "{raw["id"]}"' in ops_py


def test_digest_detects_a_changed_file(built, tmp_path):
    import shutil

    variant = tmp_path / "v"
    shutil.copytree(built["triton-norms"].variant("cpu"), variant)
    (variant / "layers.py").write_text((variant / "layers.py").read_text() + "\n# tampered\n")
    metadata = kernels_data.Metadata.read_from_file(variant / "metadata.json")
    with pytest.raises(kernels_data.DigestValidationError):
        metadata.digest.validate(kernels_data.Digest.hash_variant(kernels_data.DigestAlgorithm.SHA256, variant))


def test_get_kernel_by_version_and_revision(installed, norms, device):
    inst = installed["triton-norms"]
    assert norms.__name__.startswith(f"_triton_norms_{device}_")  # the variant of this machine
    assert "rms_norm" in norms.__all__
    pinned = kernels.get_kernel(f"{ORG}/triton-norms", revision=inst.commit)
    assert pinned.__file__ == norms.__file__
    assert str(inst.snapshot) in norms.__file__


def test_unknown_version_fails_with_the_library_error(installed):
    with pytest.raises(ValueError, match="Version 2 not found, available versions: 1"):
        kernels.get_kernel(f"{ORG}/triton-norms", version=2)


def test_get_local_kernel_and_LOCAL_KERNELS(built, installed, hf_home, device):
    path = built["triton-norms"].path
    assert kernels.get_local_kernel(path).__name__.startswith(f"_triton_norms_{device}_")
    # LOCAL_KERNELS is read per call; a fresh process shows a user's script.
    script = f"import kernels; k = kernels.get_kernel('someone/triton-norms', version=7); print(k.__file__)"
    env = {**os.environ, "LOCAL_KERNELS": f"someone/triton-norms={path}"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert str(path) in out.stdout


def test_install_local_cli_in_a_fresh_process(tmp_path, device):
    """What a user runs: the CLI installs into $HF_HOME; any script loads by name offline."""
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf")}
    cli = subprocess.run([sys.executable, "-m", "triton_collection.cli", "install-local", "--org", "acme", "--out", str(tmp_path / "dist"), "--json"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr
    rows = json.loads(cli.stdout)
    assert rows[0]["repo_id"] == "acme/triton-norms" and len(rows[0]["commit"]) == 40
    assert (tmp_path / "hf" / "hub" / "kernels--acme--triton-norms" / "refs" / "v1").read_text() == rows[0]["commit"]
    script = "import kernels; k = kernels.get_kernel('acme/triton-norms', version=1); print(k.__name__)"
    out = subprocess.run([sys.executable, "-c", script], env={**env, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(f"_triton_norms_{device}_")


def test_install_local_lays_again_a_snapshot_changed_in_the_cache(built, tmp_path):
    """A snapshot folder of the same commit that no longer holds the tree (emptied, a file deleted or edited in the
    cache) was kept as it was: install-local reported the revision, and get_kernel then found no build variant.
    The install lays it again; an intact snapshot is left alone (same files, same inode)."""
    from triton_collection.build import tree_commit
    from triton_collection.install import install_local

    b = built["triton-norms"]
    first = install_local(b, org="acme", cache=tmp_path)
    init = first.snapshot / "build" / "torch-cpu" / "__init__.py"
    inode = init.stat().st_ino
    assert install_local(b, org="acme", cache=tmp_path).snapshot == first.snapshot and init.stat().st_ino == inode
    for damage in (lambda: init.unlink(), lambda: init.write_text("broken = True\n"),
                   lambda: [shutil.rmtree(first.snapshot), first.snapshot.mkdir()]):
        damage()
        again = install_local(b, org="acme", cache=tmp_path)
        assert again.commit == first.commit and tree_commit(again.snapshot) == first.commit
    assert sorted(p.name for p in again.snapshot.parent.iterdir()) == [first.commit]  # no .partial / .stale left


def test_shared_modules_ship_in_every_package(built):
    shared = sorted(p.name for p in (ROOT / "torch-ext" / "_shared").glob("*.py"))
    assert shared
    for b in built.values():
        for rel in ("torch-ext/" + b.package.python_name, "build/torch-cpu", "build/torch-cuda"):
            for name in shared:
                assert (b.path / rel / name).read_bytes() == (ROOT / "torch-ext" / "_shared" / name).read_bytes()


def test_a_package_may_not_redefine_a_shared_or_generated_module(tmp_path):
    import shutil

    from triton_collection.build import package_files

    root = tmp_path / "coll"
    shutil.copytree(ROOT / "torch-ext" / "_shared", root / "torch-ext" / "_shared")
    (root / "torch-ext" / "triton_norms").mkdir(parents=True)
    (root / "torch-ext" / "triton_norms" / "__init__.py").write_text("")
    (root / "build.toml").write_text((ROOT / "build.toml").read_text().split("[package.triton-activations]")[0])
    collection = load_manifest(root)
    assert "_dispatch.py" in package_files(collection, collection.packages[0])
    for name in ("_dispatch.py", "_ops.py"):
        (root / "torch-ext" / "triton_norms" / name).write_text("")
        with pytest.raises(ValueError, match=name):
            package_files(collection, collection.packages[0])
        (root / "torch-ext" / "triton_norms" / name).unlink()


def _launching_functions(path):
    """(name, source) of each function in ``path`` that launches a kernel: ``kernel[grid](...)`` or builds launch
    metadata with ``meta_items(...)``."""
    import ast

    src = path.read_text()
    found = []
    for fn in ast.walk(ast.parse(src)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call)]
        if any(isinstance(c.func, ast.Subscript) or (isinstance(c.func, ast.Name) and c.func.id == "meta_items")
               for c in calls):
            found.append((fn.name, ast.get_source_segment(src, fn)))
    return found


def test_every_kernel_launch_names_fp_fusion():
    """Every function that launches a package kernel passes ``enable_fp_fusion`` explicitly (through
    ``_device.launch_options`` or a team plan's ``meta``), never Triton's default, which Triton 3.10 turns off: the
    bit-exact kernels need it off, the others were tuned and checked with it on. The launch helpers of
    ``_fastlaunch`` take their options from the caller and are exempt."""
    checked, missing = 0, []
    for path in sorted((ROOT / "torch-ext").rglob("*.py")):
        if path.name == "_fastlaunch.py":
            continue
        for name, src in _launching_functions(path):
            checked += 1
            if "launch_options(" not in src and "enable_fp_fusion" not in src and ".meta(" not in src:
                missing.append(f"{path.relative_to(ROOT)}:{name}")
    assert checked >= 20, checked  # the scan found the launches (softmax, norms, attention, matmul, ...)
    assert not missing, missing


def test_launch_options_names_fp_fusion_both_ways():
    """``launch_options`` gives ``enable_fp_fusion`` as asked for a compiled kernel, nothing for an interpreted one."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_device_under_test", ROOT / "torch-ext" / "_shared" / "_device.py")
    device = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(device)
    compiled, interpreted = object(), object()
    real = device.is_interpreter
    try:
        device.is_interpreter = lambda kernel: kernel is interpreted
        assert device.launch_options(compiled) == {"enable_fp_fusion": False}
        assert device.launch_options(compiled, fp_fusion=True) == {"enable_fp_fusion": True}
        assert device.launch_options(interpreted, fp_fusion=True) == {}
    finally:
        device.is_interpreter = real


def test_cli_names_a_bad_root_or_package_in_one_line(tmp_path, capsys):
    """``--root`` without a build.toml and an unknown ``--package`` end the command with one line naming the argument
    (and the known packages), not a traceback."""
    from triton_collection.cli import main

    with pytest.raises(SystemExit, match=r"--root .*nowhere: no build.toml there"):
        main(["build", "--root", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")])
    for command in ("build", "install-local"):
        with pytest.raises(SystemExit, match=r"--package: no package 'nope' in .*\(known: triton-norms, "):
            main([command, "--root", str(ROOT), "--package", "nope", "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_a_package_by_hub_python_or_short_name(tmp_path):
    """``--package`` takes a Hub name, a Python name or the short name ``triton-collection bench`` takes
    (``norms``; it was refused); a short name two packages share is refused, naming the known ones."""
    from triton_collection.cli import main
    from triton_collection.manifest import load_manifest

    collection = load_manifest(ROOT)
    for name in ("triton-norms", "triton_norms", "norms"):
        assert collection.package(name).name == "triton-norms"
    assert main(["build", "--root", str(ROOT), "--package", "softmax", "--out", str(tmp_path / "out")]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if not p.name.startswith(".")) == ["triton-softmax"]
    root = tmp_path / "twin"
    for python_name in [p.python_name for p in collection.packages] + ["acme_norms"]:
        (root / "torch-ext" / python_name).mkdir(parents=True)
        (root / "torch-ext" / python_name / "__init__.py").write_text("")
    (root / "build.toml").write_text((ROOT / "build.toml").read_text() + '\n[package.acme-norms]\n'
                                     'python-name = "acme_norms"\nversion = 1\ndescription = "another norms"\n')
    assert load_manifest(root).package("acme-norms").python_name == "acme_norms"
    with pytest.raises(KeyError, match="no package 'norms'"):
        load_manifest(root).package("norms")


@pytest.mark.parametrize("org", ["../../victim", "a/b", "my org", "", "a--b", ".hidden"])
def test_a_bad_org_is_refused_before_anything_is_written(org, tmp_path, capsys):
    """``--org`` names local folders (``dist/local/<org>``, which the build replaces) as well as repo ids: a name that
    is not a Hub organisation (one escaping the output folder, a slash, a space, empty, ``--``) is refused with one
    line naming it, before any folder is written or deleted; the library functions refuse it too."""
    from triton_collection.build import build_package
    from triton_collection.cli import main
    from triton_collection.install import install_local
    from triton_collection.publish import PublishError, publish_collection

    victim = tmp_path / "victim" / "triton-norms"
    victim.mkdir(parents=True)
    (victim / "keep.txt").write_text("keep")
    out = tmp_path / "out" / "local" / "x"
    for command in ("build", "install-local", "publish"):
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--root", str(ROOT), "--package", "triton-norms", "--org", org, "--out", str(out)])
        assert exit_info.value.code == 2
        assert f"argument --org: org {org!r} is not a Hub organisation name" in capsys.readouterr().err
    collection = load_manifest(ROOT)
    package = collection.package("triton-norms")
    with pytest.raises(ValueError, match="is not a Hub organisation name"):
        build_package(collection, package, out, org=org)
    with pytest.raises(ValueError, match="is not a Hub organisation name"):
        install_local(object(), org=org, cache=tmp_path / "cache")
    with pytest.raises(PublishError, match="check org: org .* is not a Hub organisation name"):
        publish_collection(collection, org=org, packages=["triton-norms"], dry_run=True, out=out)
    assert (victim / "keep.txt").read_text() == "keep" and not (tmp_path / "out").exists()
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("member", ["    def __init__(self):\n        super().__init__()\n", "    foo = 1\n",
                                    "    def helper(self):\n        pass\n", "    eps: float = 1e-6\n"])
def test_a_layer_breaking_the_kernels_rules_is_refused_at_build(member, tmp_path, capsys):
    """A layer with its own ``__init__`` or a member ``nn.Module`` lacks (other than has_backward /
    can_torch_compile) is refused when the package is built, naming the layer and the member, before anything is
    written: ``kernels`` would refuse it only at ``kernelize`` time, in a user's process. Bare annotations (the
    replaced module's attributes, ``dim: int``) and overrides of nn.Module members are allowed, as ``kernels``
    allows them."""
    from triton_collection.build import build_package, check_layer_rules

    for layers_py in sorted((ROOT / "torch-ext").glob("*/layers.py")):
        check_layer_rules(layers_py)  # the shipped layers pass
    root = _norms_only_root(tmp_path)
    layers_py = root / "torch-ext" / "triton_norms" / "layers.py"
    source = layers_py.read_text()
    anchor = "class LlamaRMSNorm(nn.Module):\n"
    assert anchor in source
    name = member.split("def ")[-1].split("(")[0] if "def " in member else member.split()[0].rstrip(":")
    layers_py.write_text(source.replace(anchor, anchor + "    dim: int\n" + member))
    collection = load_manifest(root)
    with pytest.raises(ValueError, match=f"layer LlamaRMSNorm defines '{name}': a kernels layer may define only"):
        build_package(collection, collection.packages[0], tmp_path / "out", org=ORG)
    assert not (tmp_path / "out").exists()
    from triton_collection.cli import main  # the CLI says it in one line (it printed a traceback)

    for command in ("build", "install-local"):
        assert main([command, "--root", str(root), "--out", str(tmp_path / "cli"), "--org", ORG]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"{command} failed: ") and "layer LlamaRMSNorm defines" in err and "Traceback" not in err
    assert not (tmp_path / "cli").exists()


@pytest.mark.parametrize("extra,base", [
    ("class _ScaleBase(nn.Module):\n    def scale(self, x):\n        return 2 * x\n\n\n"
     "class ScaledIdentity(_ScaleBase):\n    def forward(self, input):\n        return self.scale(input)\n", "_ScaleBase"),
    ("class Helper:\n    pass\n", "object"),
    ("class Mixed(nn.Module, metaclass=type):\n    def forward(self, x):\n        return x\n", "nn.Module, metaclass=type"),
])
def test_a_layer_deriving_from_another_class_is_refused_at_build(extra, base, tmp_path):
    """kernels counts a layer's inherited members too (``inspect.getmembers``) and refuses a class that is not a
    module: a layer inheriting ``scale`` from a helper base passed the build's check of the class body, then
    ``kernelize`` refused it in the user's process. Every layer must derive from nn.Module alone."""
    from triton_collection.build import build_package

    root = _norms_only_root(tmp_path)
    layers_py = root / "torch-ext" / "triton_norms" / "layers.py"
    layers_py.write_text(layers_py.read_text() + "\n\n" + extra)
    collection = load_manifest(root)
    with pytest.raises(ValueError, match=f"derives from {re.escape(base)}: a kernels layer derives from nn.Module alone"):
        build_package(collection, collection.packages[0], tmp_path / "out", org=ORG)
    assert not (tmp_path / "out").exists()


def test_manifest_reads_each_package_version(tmp_path):
    (tmp_path / "torch-ext" / "triton_x").mkdir(parents=True)
    (tmp_path / "torch-ext" / "triton_x" / "__init__.py").write_text("")
    (tmp_path / "build.toml").write_text('[general]\nname = "c"\n\n[general.hub]\norg = "o"\n\n'
                                         '[package.triton-x]\npython-name = "triton_x"\nversion = 3\n')
    assert load_manifest(tmp_path).package("triton-x").version == 3


def _norms_only_root(tmp_path, manifest_edit=None):
    """A collection of triton-norms alone (its source and the shared modules), build.toml optionally edited."""
    import shutil

    root = tmp_path / "coll"
    shutil.copytree(ROOT / "torch-ext" / "_shared", root / "torch-ext" / "_shared")
    shutil.copytree(ROOT / "torch-ext" / "triton_norms", root / "torch-ext" / "triton_norms")
    manifest = (ROOT / "build.toml").read_text().split("[package.triton-activations]")[0]
    (root / "build.toml").write_text(manifest_edit(manifest) if manifest_edit else manifest)
    return root


@pytest.mark.parametrize("version", ['"abc"', "1.5", "true", "0", "-1"])
def test_a_version_that_is_not_a_whole_number_is_refused_in_one_line(version, tmp_path, capsys):
    """``version = 1.5`` (or ``true``) in build.toml was truncated to v1 without a word, ``"abc"`` ended the CLI with
    a traceback, ``-1`` left a half-written tree: the manifest refuses them, and the CLI says so in one line."""
    from triton_collection.cli import main

    root = _norms_only_root(tmp_path, lambda m: m.replace("\nversion = 1\n", f"\nversion = {version}\n", 1))
    with pytest.raises(ValueError, match=r"\[package.triton-norms\]: version must be a whole number >= 1"):
        load_manifest(root)
    for command in ("build", "install-local"):
        with pytest.raises(SystemExit, match=r"build.toml: \[package.triton-norms\]: version must be a whole number"):
            main([command, "--root", str(root), "--out", str(tmp_path / "out")])
    (root / "build.toml").write_text("[general\n")  # not TOML at all: one line too
    with pytest.raises(SystemExit, match=r"build.toml: "):
        main(["build", "--root", str(root), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_the_rendered_build_toml_is_checked_with_kernels_parser_before_writing(tmp_path, capsys):
    """A key kernel-builder does not know in the collection's ``[general]`` was rendered into the package's build.toml
    without a word (the README says the rendered build.toml is validated with kernels' parser): now the build refuses
    it, naming the key, before anything is written."""
    from triton_collection.cli import main

    root = _norms_only_root(tmp_path, lambda m: m.replace("edition = 5\n", "edition = 5\nmaintainer = \"me\"\n", 1))
    assert main(["build", "--root", str(root), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("build failed: triton-norms: the rendered build.toml is not valid") and "Unknown field maintainer" in err
    assert not (tmp_path / "out").exists()


def test_an_out_folder_that_cannot_be_written_is_one_line(tmp_path, capsys, monkeypatch):
    """``--out`` naming a file (or below one) ended build, install-local and publish with a traceback."""
    from triton_collection import publish
    from triton_collection.cli import main

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for command in ("build", "install-local"):
        assert main([command, "--root", str(ROOT), "--package", "triton-norms", "--out", str(blocker)]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"{command} failed: ") and "Not a directory" in err and "Traceback" not in err
    monkeypatch.setattr(publish.constants, "is_offline_mode", lambda: False)  # the build fails before any request
    assert main(["publish", "--root", str(ROOT), "--package", "triton-norms", "--org", ORG, "--dry-run", "--out", str(blocker)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"publish failed: {ORG}: build: ") and "Not a directory" in err


def test_publish_refuses_a_layer_breaking_the_kernels_rules_in_one_line(tmp_path, capsys, monkeypatch):
    """README: every build, ``publish``'s too, refuses such a layer before writing anything; ``publish`` did, but
    with a traceback (a ValueError out of its build), and its advice to run the same command again would not help."""
    from triton_collection import publish
    from triton_collection.cli import main

    root = _norms_only_root(tmp_path)
    layers_py = root / "torch-ext" / "triton_norms" / "layers.py"
    anchor = "class LlamaRMSNorm(nn.Module):\n"
    layers_py.write_text(layers_py.read_text().replace(anchor, anchor + "    foo = 1\n"))
    monkeypatch.setattr(publish.constants, "is_offline_mode", lambda: False)  # the build fails before any request
    for dry_run in (["--dry-run"], []):
        assert main(["publish", "--root", str(root), "--org", ORG, "--out", str(tmp_path / "out"), *dry_run]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"publish failed: {ORG}: build: ") and "layer LlamaRMSNorm defines 'foo'" in err
        assert "run the same command again" not in err
        assert "A dry run reads the Hub" not in err  # the build failed, not the Hub
    assert not (tmp_path / "out").exists()


def test_a_package_named_twice_is_built_once(tmp_path, capsys):
    """``--package triton-norms --package triton_norms`` (Hub and Python name) built, installed and listed it twice."""
    from triton_collection.build import build_collection
    from triton_collection.cli import main

    built = build_collection(load_manifest(ROOT), tmp_path / "out", org=ORG, packages=["triton-norms", "triton_norms", "triton-norms"])
    assert [b.package.name for b in built] == ["triton-norms"]
    assert main(["build", "--root", str(ROOT), "--package", "triton-norms", "--package", "triton_norms", "--out", str(tmp_path / "cli")]) == 0
    assert capsys.readouterr().out.count("triton-norms v1: ") == 1


@pytest.mark.parametrize("edit, message", [
    (lambda src: src + "def broken(:\n", r"__init__.py:{line}: invalid syntax \(a syntax error: the package would not import\)"),
    (lambda src: src + '__all__ = [x for x in ("a",)] + ["b"]\n',
     r"__init__.py:{line}: __all__ must be a literal list of strings .*got \[x for x in \('a',\)\] \+ \['b'\]"),
], ids=["syntax-error", "all-not-a-literal"])
def test_a_source_that_does_not_parse_is_one_line_and_keeps_the_previous_build(edit, message, tmp_path, capsys, monkeypatch):
    """A syntax error in a package's source (or an ``__all__`` that is not a literal list) ended build, install-local
    and publish with a traceback (SyntaxError; AttributeError 'BinOp' object has no attribute 'elts'), after the
    previous build at ``--out`` had been deleted (a half-written tree was left): now one line names the file and
    line, and ``--out`` keeps what it held."""
    from triton_collection import publish
    from triton_collection.build import tree_commit
    from triton_collection.cli import main

    root = _norms_only_root(tmp_path)
    out = tmp_path / "out"
    assert main(["build", "--root", str(root), "--out", str(out)]) == 0
    before = tree_commit(out / "triton-norms")
    init_py = root / "torch-ext" / "triton_norms" / "__init__.py"
    source = init_py.read_text()
    init_py.write_text(edit(source))
    expected = message.format(line=len(source.splitlines()) + 1)
    monkeypatch.setattr(publish.constants, "is_offline_mode", lambda: False)  # the build fails before any request
    capsys.readouterr()
    for command, extra, prefix in (("build", [], "build failed: "), ("install-local", [], "install-local failed: "),
                                   ("publish", ["--org", ORG, "--dry-run"], f"publish failed: {ORG}: build: ")):
        assert main([command, "--root", str(root), "--out", str(out), *extra]) == 1, command
        err = capsys.readouterr().err
        assert err.startswith(prefix + str(init_py)) and re.search(expected, err.splitlines()[0]), err
        assert "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == ["triton-norms"]
    assert tree_commit(out / "triton-norms") == before


def _norms_and_activations_root(tmp_path):
    """A collection of triton-norms and triton-activations (in that order), their sources and the shared modules."""
    root = _norms_only_root(tmp_path)
    shutil.copytree(ROOT / "torch-ext" / "triton_activations", root / "torch-ext" / "triton_activations")
    (root / "build.toml").write_text((ROOT / "build.toml").read_text().split("[package.triton-softmax]")[0])
    return root


def test_a_refusal_in_a_later_package_writes_nothing(tmp_path, capsys):
    """README: every build refuses a layer breaking the kernels rules "before writing anything"; a refusal in a later
    package left the earlier ones already rebuilt in ``--out``. Now every package is checked first, so ``--out`` keeps
    the previous build of each (and a fresh ``--out`` is not created)."""
    from triton_collection.cli import main

    root = _norms_and_activations_root(tmp_path)
    out = tmp_path / "out"
    assert main(["build", "--root", str(root), "--out", str(out)]) == 0
    norms_init = root / "torch-ext" / "triton_norms" / "__init__.py"
    norms_init.write_text(norms_init.read_text() + "# changed after the first build\n")  # a rebuild would ship it
    layers_py = root / "torch-ext" / "triton_activations" / "layers.py"
    anchor = "class SiluAndMul(nn.Module):\n"
    layers_py.write_text(layers_py.read_text().replace(anchor, anchor + "    def __init__(self):\n        super().__init__()\n"))
    capsys.readouterr()
    for command in ("build", "install-local"):
        for target in (out, tmp_path / "fresh"):
            assert main([command, "--root", str(root), "--out", str(target)]) == 1
            err = capsys.readouterr().err
            assert err.startswith(f"{command} failed: ") and "layer SiluAndMul defines '__init__'" in err
    shipped = out / "triton-norms" / "build" / "torch-cuda" / "__init__.py"
    assert "changed after the first build" not in shipped.read_text()
    assert sorted(p.name for p in out.iterdir()) == ["triton-activations", "triton-norms"]
    assert not (tmp_path / "fresh").exists()


def test_a_failure_while_rendering_leaves_out_as_it_was(tmp_path, monkeypatch):
    """The trees are rendered into a staging folder inside ``--out`` and replace the previous ones only when all have
    rendered: an error writing the second package (a full disk, ...) leaves the first one's previous build in place
    and no staging folder behind; the next build replaces both."""
    from triton_collection import build
    from triton_collection.cli import main

    root = _norms_and_activations_root(tmp_path)
    out = tmp_path / "out"
    assert main(["build", "--root", str(root), "--out", str(out)]) == 0
    norms_init = root / "torch-ext" / "triton_norms" / "__init__.py"
    norms_init.write_text(norms_init.read_text() + "# changed after the first build\n")
    write_variant = build._write_variant

    def failing(variant, files, package, *args):
        if package.name == "triton-activations":
            raise OSError(28, "No space left on device", str(variant))
        return write_variant(variant, files, package, *args)

    monkeypatch.setattr(build, "_write_variant", failing)
    with pytest.raises(OSError, match="No space left on device"):
        build.build_collection(load_manifest(root), out, org=ORG)
    shipped = out / "triton-norms" / "build" / "torch-cuda" / "__init__.py"
    assert "changed after the first build" not in shipped.read_text()
    assert sorted(p.name for p in out.iterdir()) == ["triton-activations", "triton-norms"]
    with pytest.raises(OSError, match="No space left on device"):  # a fresh --out is not left behind either
        build.build_collection(load_manifest(root), tmp_path / "fresh", org=ORG)
    assert not (tmp_path / "fresh").exists()
    monkeypatch.setattr(build, "_write_variant", write_variant)
    built = build.build_collection(load_manifest(root), out, org=ORG)
    assert [b.path for b in built] == [out / "triton-norms", out / "triton-activations"]
    assert "changed after the first build" in shipped.read_text()
    assert sorted(p.name for p in out.iterdir()) == ["triton-activations", "triton-norms"]


def test_an_interrupted_swap_puts_the_previous_trees_back(tmp_path, monkeypatch):
    """Ctrl-C (or any exception) between the renames that swap the new trees in puts back the trees already
    replaced: ``--out`` holds the previous build whole, not a mix (an OSError alone was rolled back, and the
    previous trees of any other exception were deleted with the staging folder). A tree that cannot be put back
    is kept in the staging folder, whose path the error names."""
    from pathlib import Path

    from triton_collection import build

    root = _norms_and_activations_root(tmp_path)
    out = tmp_path / "out"
    build.build_collection(load_manifest(root), out, org=ORG)
    before = {p.name: build.tree_commit(p) for p in out.iterdir()}
    norms_init = root / "torch-ext" / "triton_norms" / "__init__.py"
    norms_init.write_text(norms_init.read_text() + "# changed after the first build\n")
    (root / "torch-ext" / "triton_activations" / "__init__.py").write_text(
        (root / "torch-ext" / "triton_activations" / "__init__.py").read_text() + "# changed too\n")
    rename = Path.rename

    def interrupted(self, target):
        if Path(target) == out / "triton-activations" and self.parent.name == "new":
            raise KeyboardInterrupt
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build.build_collection(load_manifest(root), out, org=ORG)
    assert {p.name: build.tree_commit(p) for p in out.iterdir()} == before  # no staging folder left either

    def stuck(self, target):  # the swap fails, and so does putting triton-norms back
        if Path(target) == out / "triton-activations" and self.parent.name == "new":
            raise OSError(28, "No space left on device")
        if Path(target) == out / "triton-norms" and self.parent.name == "previous":
            raise OSError(16, "Device or resource busy")
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", stuck)
    with pytest.raises(OSError, match=r"previous trees of triton-norms could not be put back: they are in .*previous"):
        build.build_collection(load_manifest(root), out, org=ORG)
    kept = [p for p in out.glob(".triton-collection-staging-*/previous/triton-norms")]
    assert len(kept) == 1 and build.tree_commit(kept[0]) == before["triton-norms"]


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.replace("edition = 5\n", "edition = 5.0\n"), r"\[general\] edition = 5.0: a float cannot be rendered"),
    (lambda m: m + "\n[package.triton-norms.torch-noarch]\nwhen = 2024-01-01\n",
     r"\[package.triton-norms.torch-noarch\] when = datetime.date\(2024, 1, 1\): a date cannot be rendered"),
    (lambda m: m + "\n[package.triton-norms.torch-noarch.sub]\nx = 1\n",
     r"\[package.triton-norms.torch-noarch\] sub = \{'x': 1\}: a table cannot be rendered"),
    (lambda m: m.replace('pyext = ["py"]', 'pyext = ["py", 1.5]'), r"\[torch-noarch\] pyext = \['py', 1.5\]: a float"),
    (lambda m: "package = 1\n" + m.split("\n[package.triton-norms]")[0], r"package \(the \[package.<hub-name>\] tables\) must be a table, got 1"),
    (lambda m: m.replace("[package.triton-norms]", "[package]\nfoo = 1\n\n[package.triton-norms]"), r"\[package\] foo must be a table, got 1"),
    (lambda m: m.replace("[general.hub]\norg =", "[tool]\norg =").replace("edition = 5\n", 'edition = 5\nhub = "x"\n'),
     r"unknown top-level keys \['tool'\]"),
    (lambda m: m.replace("edition = 5\n", 'edition = 5\nhub = "x"\n').replace('[general.hub]\norg = "triton-collection"\n', ""),
     r"\[general\] hub must be a table, got 'x'"),
    (lambda m: "general = [1]\n" + m[m.index("\n[package.triton-norms]"):], r"general must be a table, got \[1\]"),
    (lambda m: m.replace('org = "triton-collection"', "org = 5"), r"\[general.hub\] org must be a string"),
    (lambda m: m.replace('org = "triton-collection"', 'org = "x"\nrepo = "y"'), r"\[general.hub\] has unknown keys \['repo'\]"),
    (lambda m: m.replace("description = ", "description = 5\n#"), r"\[package.triton-norms\]: description must be a string, got 5"),
    (lambda m: "", r"no \[package.<hub-name>\] table: the collection has no package to build"),
    (lambda m: m.split("\n[package.triton-norms]")[0], r"no \[package.<hub-name>\] table"),
], ids=["float", "date", "nested-table", "float-in-array", "package-not-a-table", "package-value", "unknown-top-level",
        "hub-not-a-table", "general-not-a-table", "org-not-a-string", "hub-unknown-key", "description", "empty", "no-package"])
def test_a_malformed_build_toml_is_one_line_naming_the_key(edit, message, tmp_path, capsys):
    """A build.toml of the wrong structure (a float or a date the renderer cannot write, a value where a table
    belongs, ...) ended the CLI with a traceback (TypeError, AttributeError), and an empty one built nothing with exit
    code 0: the manifest refuses each, naming the key path, and the CLI says so in one line."""
    from triton_collection.cli import main

    root = tmp_path / "coll"
    (root / "torch-ext" / "triton_norms").mkdir(parents=True)
    (root / "torch-ext" / "triton_norms" / "__init__.py").write_text("")
    (root / "build.toml").write_text(edit((ROOT / "build.toml").read_text().split("[package.triton-activations]")[0]))
    with pytest.raises(ValueError, match=message):
        load_manifest(root)
    for command in ("build", "install-local"):
        with pytest.raises(SystemExit, match=r"build.toml: " + message):
            main([command, "--root", str(root), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_a_torch_noarch_value_of_the_wrong_type_is_named_by_kernels_parser(tmp_path, capsys):
    """``pyext = 5`` (a renderable value of the wrong type) was a TypeError traceback (the package's files were listed
    before the rendered build.toml was checked): kernels' parser names it now, before anything is read or written."""
    from triton_collection.cli import main

    root = _norms_only_root(tmp_path, lambda m: m.replace('pyext = ["py"]', "pyext = 5"))
    assert main(["build", "--root", str(root), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err == ("build failed: triton-norms: the rendered build.toml is not valid for kernel-builder: Cannot parse "
                   "build configuration in `<package>`: Cannot parse TOML in <package>/build.toml: Invalid type integer "
                   "`5`. Expected a sequence\n")
    assert not (tmp_path / "out").exists()


def test_a_syntax_error_in_any_module_is_refused_before_writing(tmp_path, capsys):
    """Check_sources parses every .py file (not only __init__.py / layers.py): a syntax error in rms_norm.py is
    one line naming the file, and --out keeps the previous build."""
    from triton_collection.build import tree_commit
    from triton_collection.cli import main

    root = _norms_only_root(tmp_path)
    out = tmp_path / "out"
    assert main(["build", "--root", str(root), "--out", str(out)]) == 0
    before = tree_commit(out / "triton-norms")
    module = root / "torch-ext" / "triton_norms" / "rms_norm.py"
    module.write_text(module.read_text() + "def broken(:\n")
    capsys.readouterr()
    assert main(["build", "--root", str(root), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "rms_norm.py:" in err and "syntax error" in err, err
    assert tree_commit(out / "triton-norms") == before


def test_an_all_with_a_non_string_is_refused(tmp_path, capsys):
    """__all__ must be a literal list of strings: ["rms_norm", 1] is refused naming __init__.py."""
    from triton_collection.cli import main

    root = _norms_only_root(tmp_path)
    init_py = root / "torch-ext" / "triton_norms" / "__init__.py"
    init_py.write_text(init_py.read_text() + '__all__ = ["rms_norm", 1]\n')
    assert main(["build", "--root", str(root), "--out", str(tmp_path / "out")]) == 1
    assert "__all__ must be a literal list of strings" in capsys.readouterr().err


def test_a_render_failure_into_a_fresh_out_leaves_no_folder(tmp_path, monkeypatch):
    """A failure while rendering (after the checks) into an --out that did not exist removes the folder it
    created."""
    from triton_collection import build
    from triton_collection.manifest import load_manifest

    root = _norms_only_root(tmp_path)

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(build, "_render", fail)
    out = tmp_path / "fresh"
    with pytest.raises(OSError, match="disk full"):
        build.build_collection(load_manifest(root), out, org="triton-collection")
    assert not out.exists()
