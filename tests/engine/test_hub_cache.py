"""The local Hugging Face cache: where it is, what it holds, and a walk that never breaks.

Every cache here is built in ``tmp_path`` the way the hub lays one out: contents in
``blobs/``, relative symbolic links from ``snapshots/<commit>/``, the commit of "main" in
``refs/main``.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pytest

from memfit.engine import hub_cache
from memfit.engine.errors import EstimateError
from memfit.engine.hub_cache import cache_root, find_model, scan_cache

C1 = "1" * 40
C2 = "2" * 40
CONFIG = b'{"model_type": "llama"}'

pytestmark = pytest.mark.skipif(
    not hasattr(os, "symlink") or os.name == "nt", reason="the hub cache layout uses symlinks"
)


def add_file(repo: Path, commit: str, rel: str, content: bytes) -> Path:
    """Store ``content`` as a blob and link ``snapshots/<commit>/<rel>`` to it."""
    blob = repo / "blobs" / hashlib.sha256(content).hexdigest()
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(content)
    link = repo / "snapshots" / commit / rel
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(blob, link.parent))
    return link


def set_ref(repo: Path, name: str, commit: str) -> None:
    ref = repo / "refs" / name
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(commit)


def make_model(root: Path, repo_id: str = "org/tiny", commits: tuple[str, ...] = (C1,)) -> Path:
    """A model whose revisions share config.json and each have their own weights."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    for i, commit in enumerate(commits):
        add_file(repo, commit, "config.json", CONFIG)
        add_file(repo, commit, "model.safetensors", bytes(100 + i))
    set_ref(repo, "main", commits[0])
    return repo


# -- where the cache is ---------------------------------------------------------------

ENV = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return monkeypatch


def test_cache_root_default_is_under_home(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert cache_root() == tmp_path / "home" / ".cache" / "huggingface" / "hub"


def test_cache_root_precedence(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "huggingface" / "hub"
    clean_env.setenv("HF_HOME", str(tmp_path / "hf"))
    assert cache_root() == tmp_path / "hf" / "hub"
    clean_env.setenv("HUGGINGFACE_HUB_CACHE", str(tmp_path / "legacy"))
    assert cache_root() == tmp_path / "legacy"
    clean_env.setenv("HF_HUB_CACHE", str(tmp_path / "hub-itself"))
    assert cache_root() == tmp_path / "hub-itself"


def test_cache_root_expands_home_and_ignores_empty(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clean_env.setenv("HF_HUB_CACHE", "")
    clean_env.setenv("HF_HOME", "~/elsewhere")
    assert cache_root() == tmp_path / "home" / "elsewhere" / "hub"


def test_scan_uses_hf_home(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    make_model(tmp_path / "hf" / "hub")
    clean_env.setenv("HF_HOME", str(tmp_path / "hf"))
    assert [m.repo_id for m in scan_cache()] == ["org/tiny"]
    assert find_model("org/tiny").commit == C1


def test_scan_uses_hf_hub_cache(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    make_model(tmp_path / "custom", "org/other")
    clean_env.setenv("HF_HOME", str(tmp_path / "hf"))
    clean_env.setenv("HF_HUB_CACHE", str(tmp_path / "custom"))
    assert [m.repo_id for m in scan_cache()] == ["org/other"]


# -- what it holds ----------------------------------------------------------------------


def test_scan_lists_models_with_revisions_refs_and_sizes(tmp_path: Path) -> None:
    repo = make_model(tmp_path, "org/tiny", (C1, C2))
    set_ref(repo, "pr/1", C2)
    (tmp_path / "datasets--org--data" / "snapshots").mkdir(parents=True)
    (tmp_path / "spaces--org--demo").mkdir()
    (tmp_path / "version.txt").write_text("1")
    (tmp_path / ".locks").mkdir()
    make_model(tmp_path, "gpt2")
    models = scan_cache(tmp_path)
    assert [m.repo_id for m in models] == ["gpt2", "org/tiny"]
    tiny = models[1]
    assert tiny.refs == (("main", C1), ("pr/1", C2))
    assert tiny.warnings == ()
    assert tiny.has_config
    assert tiny.size_on_disk == len(CONFIG) + 100 + 101  # the shared config counted once
    revs = {s.commit: s for s in tiny.revisions}
    assert set(revs) == {C1, C2}
    assert revs[C1].refs == ("main",) and revs[C2].refs == ("pr/1",)
    assert revs[C1].path == repo / "snapshots" / C1
    assert revs[C1].size == len(CONFIG) + 100 and revs[C1].files == 2
    assert revs[C1].has_config and revs[C1].missing == ()
    assert revs[C1].last_modified is not None and tiny.last_modified is not None


def test_unreferenced_and_partial_blobs_count_on_disk(tmp_path: Path) -> None:
    repo = make_model(tmp_path)
    (repo / "blobs" / "abc.incomplete").write_bytes(bytes(7))
    (model,) = scan_cache(tmp_path)
    assert model.size_on_disk == len(CONFIG) + 100 + 7
    assert model.revisions[0].size == len(CONFIG) + 100


def test_plain_files_in_a_snapshot_are_counted(tmp_path: Path) -> None:
    """Where symbolic links are unavailable the hub copies files into the snapshot."""
    snap = tmp_path / "models--org--copied" / "snapshots" / C1
    (snap / "sub").mkdir(parents=True)
    (snap / "config.json").write_bytes(CONFIG)
    (snap / "sub" / "x.bin").write_bytes(bytes(10))
    (model,) = scan_cache(tmp_path)
    assert model.revisions[0].files == 2
    assert model.size_on_disk == len(CONFIG) + 10
    assert model.revisions[0].has_config


def test_a_snapshot_without_config(tmp_path: Path) -> None:
    add_file(tmp_path / "models--org--bare", C1, "model.safetensors", b"x")
    (model,) = scan_cache(tmp_path)
    assert not model.has_config and not model.revisions[0].has_config


# -- resolving a name -------------------------------------------------------------------


def test_find_model_by_ref_commit_and_prefix(tmp_path: Path) -> None:
    repo = make_model(tmp_path, "org/tiny", (C1, C2))
    set_ref(repo, "v2", C2)
    assert find_model("org/tiny", root=tmp_path).commit == C1
    assert find_model("org/tiny@v2", root=tmp_path).commit == C2
    assert find_model("org/tiny", "v2", root=tmp_path).commit == C2
    assert find_model("org/tiny", C2, root=tmp_path).path == repo / "snapshots" / C2
    assert find_model("org/tiny@2222", root=tmp_path).commit == C2
    assert find_model("org/tiny@v2", "v2", root=tmp_path).refs == ("v2",)


def test_find_model_without_main_takes_the_only_snapshot(tmp_path: Path) -> None:
    add_file(tmp_path / "models--org--one", C1, "config.json", CONFIG)
    assert find_model("org/one", root=tmp_path).commit == C1


def test_find_model_without_main_and_several_snapshots(tmp_path: Path) -> None:
    repo = make_model(tmp_path, "org/two", (C1, C2))
    (repo / "refs" / "main").unlink()
    with pytest.raises(EstimateError, match="no 'main' ref; give a revision") as info:
        find_model("org/two", root=tmp_path)
    assert info.value.field == "model" and C1[:12] in str(info.value)


def test_missing_model_lists_close_names(tmp_path: Path) -> None:
    make_model(tmp_path, "meta-llama/Llama-3.2-1B")
    make_model(tmp_path, "Qwen/Qwen2.5-0.5B")
    with pytest.raises(
        EstimateError, match=re.escape("close names: meta-llama/Llama-3.2-1B")
    ) as info:
        find_model("meta-llama/llama-3.2-1b", root=tmp_path)
    assert info.value.field == "model"
    with pytest.raises(EstimateError, match=re.escape("close names: Qwen/Qwen2.5-0.5B")):
        find_model("Qwen2.5-0.5B", root=tmp_path)
    with pytest.raises(EstimateError, match=r"not in the Hugging Face cache .* holds 2 model"):
        find_model("org/unrelated-thing", root=tmp_path)


def test_missing_revision_lists_the_cached_ones(tmp_path: Path) -> None:
    make_model(tmp_path)
    with pytest.raises(EstimateError, match=r"'v9' is not a cached revision \(cached: main, 1111"):
        find_model("org/tiny@v9", root=tmp_path)


def test_ref_to_an_absent_snapshot(tmp_path: Path) -> None:
    repo = make_model(tmp_path)
    set_ref(repo, "v2", C2)
    with pytest.raises(EstimateError, match="ref 'v2' points at 222222222222"):
        find_model("org/tiny@v2", root=tmp_path)
    (model,) = scan_cache(tmp_path)
    assert any("ref v2 points at" in w for w in model.warnings)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "expected a non-empty string"),
        ("a/b/c", "expected a Hugging Face model id"),
        ("org/", "expected a Hugging Face model id"),
        ("../etc", "expected a Hugging Face model id"),
        ("org--x/y", "expected a Hugging Face model id"),
        ("org/x@", "nothing after '@'"),
    ],
)
def test_bad_model_ids(tmp_path: Path, name: str, message: str) -> None:
    with pytest.raises(EstimateError, match=message):
        find_model(name, root=tmp_path)


def test_conflicting_revisions(tmp_path: Path) -> None:
    make_model(tmp_path)
    with pytest.raises(EstimateError, match="names revision 'main' but 'v2' was given"):
        find_model("org/tiny@main", "v2", root=tmp_path)


# -- a cache that is empty, missing or damaged ------------------------------------------


def test_empty_and_missing_caches(tmp_path: Path) -> None:
    assert scan_cache(tmp_path) == []
    assert scan_cache(tmp_path / "nope") == []
    (tmp_path / "file").write_text("x")
    assert scan_cache(tmp_path / "file") == []
    with pytest.raises(EstimateError, match="holds 0 model"):
        find_model("org/tiny", root=tmp_path)
    with pytest.raises(EstimateError, match="there is no Hugging Face cache at"):
        find_model("org/tiny", root=tmp_path / "nope")


def test_symlink_loop_and_dangling_links_are_reported(tmp_path: Path) -> None:
    repo = make_model(tmp_path)
    snap = repo / "snapshots" / C1
    (snap / "loop_a").symlink_to("loop_b")
    (snap / "loop_b").symlink_to("loop_a")
    (snap / "gone.bin").symlink_to("../../blobs/" + "f" * 64)
    (snap / "self").symlink_to(".")  # a folder link back to itself: never followed
    (model,) = scan_cache(tmp_path)
    rev = model.revisions[0]
    assert rev.missing == ("gone.bin", "loop_a", "loop_b", "self")
    assert rev.files == 2 and rev.size == len(CONFIG) + 100
    assert any("4 file(s) missing" in w for w in model.warnings)
    assert find_model("org/tiny", root=tmp_path).missing == rev.missing


def test_links_outside_the_model_are_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "secret.bin"
    outside.write_bytes(bytes(5000))
    repo = make_model(tmp_path / "cache")
    (repo / "snapshots" / C1 / "escape.bin").symlink_to(outside)
    (repo / "snapshots" / C1 / "escape2.bin").symlink_to("../../../../secret.bin")
    (model,) = scan_cache(tmp_path / "cache")
    assert model.size_on_disk == len(CONFIG) + 100
    assert model.revisions[0].missing == ("escape.bin", "escape2.bin")


def test_linked_folders_are_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    make_model(elsewhere)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "models--org--tiny").symlink_to(elsewhere / "models--org--tiny")
    (model,) = scan_cache(tmp_path / "cache")
    assert model.revisions == () and "symbolic link" in model.warnings[0]
    with pytest.raises(EstimateError, match=r"no snapshot in the cache .*symbolic link"):
        find_model("org/tiny", root=tmp_path / "cache")


def test_unreadable_folders_become_warnings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make_model(tmp_path, "org/tiny", (C1, C2))
    real_scandir = os.scandir
    locked = os.fspath(repo / "snapshots" / C2)

    def scandir(path: str) -> object:
        if os.fspath(path) in (locked, os.fspath(repo / "blobs")):
            raise PermissionError(13, "Permission denied")
        return real_scandir(path)

    monkeypatch.setattr(hub_cache.os, "scandir", scandir)
    (model,) = scan_cache(tmp_path)
    assert len(model.revisions) == 2
    assert sum("Permission denied" in w for w in model.warnings) == 2
    assert {s.commit: s.files for s in model.revisions} == {C1: 2, C2: 0}


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads any folder")
def test_unreadable_folder_by_permissions(tmp_path: Path) -> None:
    repo = make_model(tmp_path)
    snap = repo / "snapshots" / C1
    snap.chmod(0)
    try:
        (model,) = scan_cache(tmp_path)
    finally:
        snap.chmod(0o755)
    assert model.revisions[0].files == 0
    assert any("cannot read" in w for w in model.warnings)


def test_unreadable_ref_and_junk_refs(tmp_path: Path) -> None:
    repo = make_model(tmp_path)
    set_ref(repo, "junk", "not a hash")
    (repo / "refs" / "big").write_bytes(b"a" * 100_000)
    (repo / "refs" / "link").symlink_to("main")
    (model,) = scan_cache(tmp_path)
    assert model.refs == (("main", C1),)
    assert sum("ref " in w for w in model.warnings) == 3


def test_huge_tree_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hub_cache, "MAX_REPO_ENTRIES", 50)
    repo = make_model(tmp_path)
    for i in range(200):
        add_file(repo, C1, f"shard-{i}.bin", str(i).encode())
    (model,) = scan_cache(tmp_path)
    assert any("stopped after 50 entries" in w for w in model.warnings)
    assert model.revisions[0].files < 50


def test_deep_nesting_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hub_cache, "MAX_DEPTH", 3)
    repo = make_model(tmp_path)
    add_file(repo, C1, "a/b/c/d/e/deep.bin", b"deep")
    (model,) = scan_cache(tmp_path)
    assert any("nested too deeply" in w for w in model.warnings)
    assert model.revisions[0].files == 2


def test_a_model_folder_without_snapshots(tmp_path: Path) -> None:
    (tmp_path / "models--org--empty").mkdir()
    (model,) = scan_cache(tmp_path)
    assert model.revisions == () and model.warnings == ("no snapshots/ folder",)
    with pytest.raises(EstimateError, match="has no snapshot in the cache"):
        find_model("org/empty", root=tmp_path)
