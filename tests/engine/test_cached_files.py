"""One rule for every file read of a cached model: a link is followed only when it
resolves inside its own model folder of the hub cache.

``memfit cache`` (the scan) counts a snapshot's file only then; ``memfit checkpoint``,
``memfit estimate --model org/name``, the app's model browser and a snapshot folder
imported by path read ``config.json``, ``model.safetensors.index.json`` and the shards
under the same rule, and call a file that breaks it what the listing calls it.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from memfit.engine.checkpoint import model_from_folder, read_checkpoint
from memfit.engine.cli import main
from memfit.engine.errors import EstimateError
from memfit.engine.hub_cache import NOT_HELD, find_model, scan_cache
from memfit.engine.imports import import_cached, import_path
from memfit.engine.scenario_io import scenario_from_dict
from tests.engine.test_checkpoint import CONFIG, model_folder, plain_tensors, write_safetensors
from tests.engine.test_imports import cached

pytestmark = pytest.mark.skipif(
    not hasattr(os, "symlink") or os.name == "nt", reason="the hub cache layout uses symlinks"
)

REPO = "org/tiny"
COMMIT = "a" * 40
BASE = scenario_from_dict(
    {"memfit_scenario": 1, "model": {"preset": "gpt2"}, "hardware": {"gpu": "l4"}}
)


def cache(tmp_path: Path, files: Path | None = None) -> tuple[Path, Path]:
    """A hub cache at ``tmp_path/hub`` holding ``files`` (default: the tiny Llama) as
    ``org/tiny``; the cache root and the snapshot folder."""
    root = tmp_path / "hub"
    cached(root, REPO, files or model_folder(tmp_path / "files", plain_tensors()), COMMIT)
    return root, root / "models--org--tiny" / "snapshots" / COMMIT


#: how a snapshot's link can fail the rule: (name, relink ``link`` given the file elsewhere)
BREAKS: dict[str, Callable[[Path, Path], None]] = {
    "absolute link outside": lambda link, outside: link.symlink_to(outside),
    "relative link outside": lambda link, outside: link.symlink_to(
        os.path.relpath(outside, link.parent)
    ),
    "link through a folder outside": lambda link, outside: _through_folder(link, outside),
    "dangling": lambda link, outside: link.symlink_to("../../blobs/" + "f" * 64),
    "loop": lambda link, outside: link.symlink_to(link.name),
}


def _through_folder(link: Path, outside: Path) -> None:
    blobs = link.parent.parent.parent / "blobs"
    (blobs / "elsewhere").symlink_to(outside.parent)
    link.symlink_to(os.path.relpath(blobs / "elsewhere" / outside.name, link.parent))


def relink(snapshot: Path, name: str, how: str, outside_dir: Path) -> None:
    """Point the snapshot's ``name`` as ``how`` says, at a valid copy outside the model."""
    link = snapshot / name
    outside = outside_dir / name
    outside.parent.mkdir(parents=True, exist_ok=True)
    outside.write_bytes(link.read_bytes())
    link.unlink()
    BREAKS[how](link, outside)


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out), out.getvalue()


@pytest.mark.parametrize("how", sorted(BREAKS))
def test_a_config_link_out_of_the_model_is_missing_everywhere(
    tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root, snapshot = cache(tmp_path)
    relink(snapshot, "config.json", how, tmp_path / "outside")
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    # the scan: the file is missing, the snapshot has no config
    (model,) = scan_cache(root)
    assert "config.json" in model.revisions[0].missing and not model.has_config
    code, text = run("cache")
    assert code == 0 and "(no config.json)" in text
    # every reader: the same, in the same words
    for read in (
        lambda: model_from_folder(snapshot),
        lambda: import_cached(REPO, BASE),
        lambda: import_path(snapshot, BASE),
    ):
        with pytest.raises(EstimateError, match=f"config.json.*{NOT_HELD}"):
            read()
    assert run("checkpoint", REPO)[0] == 2
    assert NOT_HELD in capsys.readouterr().err
    assert run("estimate", "--model", REPO, "--gpu", "l4")[0] == 2
    assert "no config.json" in capsys.readouterr().err
    assert run("estimate", "--model", str(snapshot), "--gpu", "l4")[0] == 2
    assert NOT_HELD in capsys.readouterr().err


@pytest.mark.parametrize("how", sorted(BREAKS))
def test_a_shard_link_out_of_the_model_is_missing(tmp_path: Path, how: str) -> None:
    _, snapshot = cache(tmp_path)
    relink(snapshot, "model.safetensors", how, tmp_path / "outside")
    assert "model.safetensors" in find_model(REPO, root=tmp_path / "hub").missing
    with pytest.raises(EstimateError, match=f"model.safetensors.*{NOT_HELD}"):
        model_from_folder(snapshot)
    # the same folder outside the cache is read as it is: the rule is the cache's
    plain = tmp_path / "copy"
    plain.mkdir()
    for name in ("config.json", "model.safetensors"):
        (plain / name).symlink_to(os.path.realpath(snapshot / name))
    if how in ("dangling", "loop"):
        with pytest.raises(EstimateError, match=r"model\.safetensors"):
            model_from_folder(plain)
    else:
        assert model_from_folder(plain)[1].tensor_count == len(plain_tensors())


def sharded_files(tmp_path: Path) -> Path:
    """The tiny Llama in two shards with an index."""
    folder = tmp_path / "sharded"
    folder.mkdir()
    tensors = plain_tensors()
    names = list(tensors)
    half = len(names) // 2
    shards = {
        "model-00001-of-00002.safetensors": {n: tensors[n] for n in names[:half]},
        "model-00002-of-00002.safetensors": {n: tensors[n] for n in names[half:]},
    }
    weight_map = {}
    for file, part in shards.items():
        write_safetensors(folder / file, part)
        weight_map.update(dict.fromkeys(part, file))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(CONFIG))
    return folder


@pytest.mark.parametrize("how", sorted(BREAKS))
def test_an_index_or_a_shard_it_names_linked_out_is_missing(tmp_path: Path, how: str) -> None:
    _, snapshot = cache(tmp_path, sharded_files(tmp_path))
    assert read_checkpoint(snapshot).tensor_count == len(plain_tensors())
    relink(snapshot, "model-00002-of-00002.safetensors", how, tmp_path / "outside")
    with pytest.raises(EstimateError, match=f"names model-00002-of-00002.safetensors.*{NOT_HELD}"):
        read_checkpoint(snapshot)


@pytest.mark.parametrize("how", sorted(BREAKS))
def test_an_index_linked_out_is_not_read(tmp_path: Path, how: str) -> None:
    _, snapshot = cache(tmp_path, sharded_files(tmp_path))
    relink(snapshot, "model.safetensors.index.json", how, tmp_path / "outside")
    # without its index the folder's shards are read as they are
    info = read_checkpoint(snapshot)
    assert info.tensor_count == len(plain_tensors())
    assert any("model.safetensors.index.json" in w and NOT_HELD in w for w in info.warnings)


def test_the_listing_and_the_reader_agree_file_by_file(tmp_path: Path) -> None:
    """Every way a snapshot's file can be held or not: the scan's ``missing`` is exactly
    what the checkpoint reader refuses to read."""
    _, snapshot = cache(tmp_path, sharded_files(tmp_path))
    shards = sorted(p.name for p in snapshot.glob("*.safetensors"))
    relink(snapshot, shards[0], "relative link outside", tmp_path / "outside")
    missing = find_model(REPO, root=tmp_path / "hub").missing
    assert missing == (shards[0],)
    with pytest.raises(EstimateError) as info:
        read_checkpoint(snapshot)
    assert shards[0] in str(info.value) and shards[1] not in str(info.value)
