"""The models in the user's local Hugging Face cache, read from disk without the network.

The hub lays a cached model out as::

    <cache>/models--{org}--{name}/
        refs/main                  # a text file: the commit hash "main" points at
        blobs/<hash>               # the files' contents, one per distinct content
        snapshots/<commit>/...     # the repository's tree at that commit: relative
                                   # symbolic links into ../../blobs/

:func:`cache_root` finds the cache as ``huggingface_hub`` does, :func:`scan_cache` lists
every model in it (datasets and spaces are skipped) and :func:`find_model` resolves
``"org/name"``, ``"org/name@revision"`` or a ref name to one snapshot folder.

The walk is defensive: directories are listed with :func:`os.scandir` without following
symbolic links, a link is followed only when it resolves inside its own repository folder
(:func:`held`, the rule every reader of a cached model's files follows too),
every :class:`OSError` (a dangling link, a link loop, an unreadable folder) becomes a
warning on the model instead of an exception, and at most :data:`MAX_REPO_ENTRIES`
entries are visited per model, :data:`MAX_ROOT_ENTRIES` at the cache's top level.

>>> import pathlib, tempfile
>>> scan_cache(pathlib.Path(tempfile.mkdtemp()) / "no-such-cache")
[]
"""

from __future__ import annotations

import difflib
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from memfit.engine.errors import EstimateError, check_text, shown
from memfit.engine.files import is_within

#: entries visited inside one model folder (refs, snapshots, blobs) before the walk stops
MAX_REPO_ENTRIES = 200_000
#: entries read at the top level of the cache
MAX_ROOT_ENTRIES = 100_000
#: folders nested inside a snapshot that are still walked
MAX_DEPTH = 32
#: the longest ref file read (a ref holds one 40-character hash)
MAX_REF_BYTES = 4096

_PREFIX = "models--"
_COMMIT = re.compile(r"[0-9a-f]{40}")
_REPO_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def cache_root() -> Path:
    """The hub cache folder, chosen as ``huggingface_hub`` chooses it.

    In order: ``HF_HUB_CACHE`` (the cache folder itself); the legacy
    ``HUGGINGFACE_HUB_CACHE``; ``$HF_HOME/hub``; ``$XDG_CACHE_HOME/huggingface/hub``;
    ``~/.cache/huggingface/hub``. ``~`` and ``$VARS`` in a value are expanded; a variable
    set to the empty string counts as not set. The folder need not exist.
    """

    def env(name: str) -> Path | None:
        value = os.environ.get(name, "")
        return Path(os.path.expandvars(os.path.expanduser(value))) if value else None

    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        hub = env(name)
        if hub is not None:
            return hub
    home = env("HF_HOME")
    if home is None:
        xdg = env("XDG_CACHE_HOME")
        home = (xdg if xdg is not None else Path(os.path.expanduser("~")) / ".cache") / (
            "huggingface"
        )
    return home / "hub"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One revision of a cached model: the folder ``snapshots/<commit>/``."""

    repo_id: str
    #: the folder's name: the commit hash
    commit: str
    #: the ref names pointing at this commit ("main", "pr/1"...), sorted
    refs: tuple[str, ...]
    path: Path
    #: ``config.json`` at the top of the snapshot resolves to a readable regular file
    has_config: bool
    #: files of the snapshot whose content is present
    files: int
    #: bytes of the distinct blobs (or plain files) this revision's files resolve to
    size: int
    #: the newest modification time (seconds since the epoch) of its files, or of the
    #: folder when it holds none; ``None`` when neither could be read
    last_modified: float | None
    #: relative paths of files whose link is dangling, loops, or points outside the model
    missing: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CachedModel:
    """One ``models--{org}--{name}`` folder of the cache."""

    repo_id: str
    path: Path
    #: the snapshots, newest first
    revisions: tuple[Snapshot, ...]
    #: ``(ref name, commit)`` for every readable ref, sorted by name
    refs: tuple[tuple[str, str], ...]
    #: bytes on disk: every distinct blob (referenced or not, partial downloads included)
    #: plus plain files inside snapshots, each counted once
    size_on_disk: int
    #: the newest modification time of any blob, file or ref (seconds since the epoch)
    last_modified: float | None
    #: what could not be read or did not make sense, in words; the scan went on
    warnings: tuple[str, ...] = field(default=())

    @property
    def has_config(self) -> bool:
        """Some revision has a ``config.json``."""
        return any(s.has_config for s in self.revisions)

    def snapshot(self, revision: str | None = None) -> Snapshot:
        """The snapshot for ``revision``: a ref name ("main"), a commit hash, or a unique
        prefix of one (at least 4 characters). Without ``revision``: the one "main" points
        at, else the only snapshot there is. Anything else is an :class:`EstimateError`
        (field ``"model"``) listing the revisions the cache holds."""
        by_commit = {s.commit: s for s in self.revisions}
        refs = dict(self.refs)
        held = self._held()
        if revision is None:
            if "main" in refs and refs["main"] in by_commit:
                return by_commit[refs["main"]]
            if len(self.revisions) == 1:
                return self.revisions[0]
            if not self.revisions:
                raise EstimateError("model", f"{self.repo_id} has no snapshot in the cache{held}")
            raise EstimateError("model", f"{self.repo_id}: no 'main' ref; give a revision{held}")
        check_text("model", revision)
        if revision in refs:
            commit = refs[revision]
            if commit in by_commit:
                return by_commit[commit]
            raise EstimateError(
                "model",
                f"{self.repo_id}: ref {revision!r} points at {commit[:12]}, whose snapshot "
                f"is not in the cache{held}",
            )
        if revision in by_commit:
            return by_commit[revision]
        matches = [
            s for s in self.revisions if len(revision) >= 4 and s.commit.startswith(revision)
        ]
        if len(matches) == 1:
            return matches[0]
        what = "matches several revisions" if matches else "is not a cached revision"
        raise EstimateError("model", f"{self.repo_id}: {shown(revision)} {what}{held}")

    def _held(self) -> str:
        names = [name for name, _ in self.refs] + [s.commit[:12] for s in self.revisions]
        return f" (cached: {', '.join(names)})" if names else ""


class _Budget:
    """Counts the directory entries a walk visits; stops it past ``limit``."""

    def __init__(self, limit: int) -> None:
        self.left = limit
        self.limit = limit
        self.exhausted = False

    def take(self) -> bool:
        self.left -= 1
        if self.left < 0:
            self.exhausted = True
        return not self.exhausted


def _entries(
    path: str, budget: _Budget, warnings: list[str], what: str
) -> Iterator[os.DirEntry[str]]:
    """The entries of the folder ``path``, within ``budget``; errors become warnings."""
    try:
        with os.scandir(path) as it:
            for entry in it:
                if not budget.take():
                    return
                yield entry
    except OSError as exc:
        warnings.append(f"cannot read {what}: {exc.strerror or exc}")


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _folder(path: Path, follow: bool = False) -> bool:
    """``path`` is a folder (not a link to one unless ``follow``); no error is raised."""
    try:
        info = os.stat(path) if follow else os.lstat(path)
    except (OSError, ValueError):
        return False
    return stat.S_ISDIR(info.st_mode)


def _is_link(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_symlink()
    except OSError:
        return False


#: a snapshot's file that is not read, in the words of the listing and of every reader
NOT_HELD = "missing, dangling or pointing outside the model"


def held(path: str | os.PathLike[str], repository: str) -> os.stat_result | None:
    """The stat of the regular file a snapshot's ``path`` holds -- a plain file, or the
    file its links resolve to inside the model folder ``repository`` (a real path, as
    :func:`os.path.realpath` gives it) -- or ``None`` when there is none: missing,
    dangling, a loop, resolving outside the model, or not a regular file.

    The one rule for every file of a cached model: the scan counts a file by it and
    every reader of a cached model (:mod:`memfit.engine.checkpoint`) reads a file only by it."""
    try:
        real = os.path.realpath(path)
        if not is_within(real, repository):
            return None
        info = os.stat(real)
    except (OSError, ValueError):
        return None
    return info if stat.S_ISREG(info.st_mode) else None


def snapshot_of(folder: str | os.PathLike[str]) -> tuple[str, str] | None:
    """``(repo id, real path of its model folder)`` when ``folder`` is a snapshot of the
    hub cache (``.../models--org--name/snapshots/<commit>``), however it was reached;
    ``None`` for any other folder."""
    absolute = Path(os.path.abspath(folder))
    parent = absolute.parent
    repo_id = _repo_id(parent.parent.name) if parent.name == "snapshots" else None
    if repo_id is None:
        return None
    return repo_id, os.path.realpath(parent.parent)


class _RepoWalk:
    """The state of scanning one model folder."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.real = os.path.realpath(path)
        self.budget = _Budget(MAX_REPO_ENTRIES)
        self.warnings: list[str] = []
        #: (device, inode) -> size of every distinct file counted
        self.sizes: dict[tuple[int, int], int] = {}
        self.newest: float | None = None

    def note_time(self, mtime: float) -> None:
        if self.newest is None or mtime > self.newest:
            self.newest = mtime

    def target(self, entry: os.DirEntry[str]) -> os.stat_result | None:
        """The stat of what a snapshot entry holds: a plain file, or the file its link
        resolves to inside this model's folder; ``None`` if there is none to count."""
        return held(entry.path, self.real)

    def refs(self) -> dict[str, str]:
        found: dict[str, str] = {}
        top = self.path / "refs"
        if not _folder(top):
            return found
        stack: list[tuple[str, str, int]] = [(os.fspath(top), "", 0)]
        while stack:
            folder, prefix, depth = stack.pop()
            for entry in _entries(folder, self.budget, self.warnings, f"refs/{prefix}"):
                name = prefix + entry.name
                if _is_dir(entry):
                    if depth < MAX_DEPTH:
                        stack.append((entry.path, name + "/", depth + 1))
                    continue
                commit = self._read_ref(entry, name)
                if commit is not None:
                    found[name] = commit
        return found

    def _read_ref(self, entry: os.DirEntry[str], name: str) -> str | None:
        try:
            if not entry.is_file(follow_symlinks=False):
                self.warnings.append(f"ref {name} is not a plain file; skipped")
                return None
            self.note_time(entry.stat(follow_symlinks=False).st_mtime)
            with open(entry.path, "rb") as f:
                text = f.read(MAX_REF_BYTES + 1).decode("ascii", "replace").strip()
        except OSError as exc:
            self.warnings.append(f"cannot read ref {name}: {exc.strerror or exc}")
            return None
        if not _COMMIT.fullmatch(text):
            self.warnings.append(f"ref {name} does not hold a commit hash; skipped")
            return None
        return text

    def snapshot(self, repo_id: str, entry: os.DirEntry[str], refs: tuple[str, ...]) -> Snapshot:
        mine: dict[tuple[int, int], int] = {}
        files = 0
        missing: list[str] = []
        newest: float | None = None
        has_config = False
        stack: list[tuple[str, str, int]] = [(entry.path, "", 0)]
        while stack:
            folder, prefix, depth = stack.pop()
            where = f"snapshots/{entry.name}/{prefix}"
            for item in _entries(folder, self.budget, self.warnings, where):
                rel = prefix + item.name
                if _is_dir(item):
                    if depth < MAX_DEPTH:
                        stack.append((item.path, rel + "/", depth + 1))
                    else:
                        self.warnings.append(f"{where}{item.name}: nested too deeply; skipped")
                    continue
                info = self.target(item)
                if info is None:
                    missing.append(rel)
                    continue
                files += 1
                key = (info.st_dev, info.st_ino)
                mine[key] = info.st_size
                self.sizes[key] = info.st_size
                self.note_time(info.st_mtime)
                newest = info.st_mtime if newest is None else max(newest, info.st_mtime)
                has_config = has_config or rel == "config.json"
        if newest is None:
            try:
                newest = entry.stat(follow_symlinks=False).st_mtime
            except OSError:
                newest = None
        if missing:
            self.warnings.append(
                f"snapshot {entry.name[:12]}: {len(missing)} file(s) {NOT_HELD} "
                f"(first: {missing[0]})"
            )
        return Snapshot(
            repo_id=repo_id,
            commit=entry.name,
            refs=refs,
            path=Path(entry.path),
            has_config=has_config,
            files=files,
            size=sum(mine.values()),
            last_modified=newest,
            missing=tuple(sorted(missing)),
        )

    def blobs(self) -> None:
        top = self.path / "blobs"
        if not _folder(top):
            return
        for entry in _entries(os.fspath(top), self.budget, self.warnings, "blobs/"):
            try:
                if entry.is_file(follow_symlinks=False):
                    info = entry.stat(follow_symlinks=False)
                    self.sizes[(info.st_dev, info.st_ino)] = info.st_size
                    self.note_time(info.st_mtime)
            except OSError as exc:
                self.warnings.append(f"cannot read blob {entry.name}: {exc.strerror or exc}")


def _scan_repo(path: Path, repo_id: str) -> CachedModel:
    """Everything :class:`CachedModel` says about the model folder ``path``."""
    if os.path.islink(path):
        return CachedModel(
            repo_id, path, (), (), 0, None, ("the folder is a symbolic link; not followed",)
        )
    walk = _RepoWalk(path)
    refs = walk.refs()
    by_commit: dict[str, list[str]] = {}
    for name, commit in refs.items():
        by_commit.setdefault(commit, []).append(name)
    snapshots: list[Snapshot] = []
    top = path / "snapshots"
    if _folder(top):
        for entry in _entries(os.fspath(top), walk.budget, walk.warnings, "snapshots/"):
            if _is_dir(entry):
                names = tuple(sorted(by_commit.get(entry.name, ())))
                snapshots.append(walk.snapshot(repo_id, entry, names))
    elif not walk.warnings:
        walk.warnings.append("no snapshots/ folder")
    walk.blobs()
    held = {s.commit for s in snapshots}
    for name, commit in sorted(refs.items()):
        if commit not in held:
            walk.warnings.append(f"ref {name} points at {commit[:12]}, which has no snapshot")
    if walk.budget.exhausted:
        walk.warnings.append(f"stopped after {walk.budget.limit:,} entries; counts are partial")
    snapshots.sort(key=lambda s: (s.last_modified or 0.0, s.commit), reverse=True)
    return CachedModel(
        repo_id=repo_id,
        path=path,
        revisions=tuple(snapshots),
        refs=tuple(sorted(refs.items())),
        size_on_disk=sum(walk.sizes.values()),
        last_modified=walk.newest,
        warnings=tuple(walk.warnings),
    )


def _repo_id(folder_name: str) -> str | None:
    """``"org/name"`` for a ``models--org--name`` folder; ``None`` for anything else."""
    if not folder_name.startswith(_PREFIX):
        return None
    parts = folder_name[len(_PREFIX) :].split("--")
    if not 1 <= len(parts) <= 2 or not all(_REPO_PART.fullmatch(p) for p in parts):
        return None
    return "/".join(parts)


def _model_folders(root: Path) -> list[tuple[str, Path]]:
    """``(repo id, folder)`` of every model folder at the top of ``root``, sorted."""
    found: list[tuple[str, Path]] = []
    ignored: list[str] = []
    for entry in _entries(os.fspath(root), _Budget(MAX_ROOT_ENTRIES), ignored, "the cache"):
        repo_id = _repo_id(entry.name)
        if repo_id is not None and (_is_dir(entry) or _is_link(entry)):
            found.append((repo_id, Path(entry.path)))
    return sorted(found)


def scan_cache(root: Path | None = None) -> list[CachedModel]:
    """Every model in the hub cache at ``root`` (default :func:`cache_root`), sorted by
    repo id. A missing or unreadable cache is an empty list; a model folder that cannot be
    read in part or at all is listed with what could be read and its ``warnings``."""
    root = cache_root() if root is None else Path(root)
    return [_scan_repo(path, repo_id) for repo_id, path in _model_folders(root)]


def _split(repo_id: str, revision: str | None) -> tuple[str, str | None]:
    check_text("model", repo_id)
    repo, at, rev = repo_id.partition("@")
    if at:
        if not rev:
            raise EstimateError("model", f"{shown(repo_id)}: nothing after '@'")
        if revision is not None and revision != rev:
            raise EstimateError(
                "model", f"{shown(repo_id)} names revision {rev!r} but {revision!r} was given"
            )
        revision = rev
    parts = repo.split("/")
    if not 1 <= len(parts) <= 2 or not all(_REPO_PART.fullmatch(p) for p in parts) or "--" in repo:
        raise EstimateError(
            "model", f"got {shown(repo_id)}, expected a Hugging Face model id such as 'org/name'"
        )
    return repo, revision


def close_names(repo_id: str, names: list[str], limit: int = 5) -> list[str]:
    """The ids in ``names`` closest to ``repo_id``: same letters in another case first,
    then similar spellings of the whole id or of its part after the ``/``."""
    lower = {n.lower(): n for n in names}
    wanted = repo_id.lower()
    picks: list[str] = []
    if wanted in lower:
        picks.append(lower[wanted])
    picks += [lower[n] for n in difflib.get_close_matches(wanted, list(lower), limit, 0.6)]
    tail = wanted.rsplit("/", 1)[-1]
    tails = {n.rsplit("/", 1)[-1]: n for n in lower}
    picks += [lower[tails[t]] for t in difflib.get_close_matches(tail, list(tails), limit, 0.6)]
    picks += [lower[n] for n in lower if tail and tail in n]
    return [p for p in dict.fromkeys(picks) if p != repo_id][:limit]


def find_model(repo_id: str, revision: str | None = None, root: Path | None = None) -> Snapshot:
    """The cached snapshot of ``repo_id`` (``"org/name"``, or ``"org/name@revision"``).

    ``revision`` is a ref name, a commit hash or a unique prefix of one; without it "main"
    is used (see :meth:`CachedModel.snapshot`). A model that is not in the cache is an
    :class:`EstimateError` (field ``"model"``) naming the cache and the closest ids in it.
    """
    repo, revision = _split(repo_id, revision)
    root = cache_root() if root is None else Path(root)
    folder = root / (_PREFIX + repo.replace("/", "--"))
    if not (_folder(folder) or os.path.islink(folder)):
        if not _folder(root, follow=True):
            raise EstimateError(
                "model",
                f"{repo} is not cached: there is no Hugging Face cache at {root} "
                "(HF_HUB_CACHE or HF_HOME say where it is)",
            )
        names = [name for name, _ in _model_folders(root)]
        near = close_names(repo, names)
        hint = (
            f"; close names: {', '.join(near)}"
            if near
            else f"; the cache holds {len(names):,} model(s)"
        )
        raise EstimateError("model", f"{repo} is not in the Hugging Face cache at {root}{hint}")
    model = _scan_repo(folder, repo)
    if not model.revisions:
        why = f": {'; '.join(model.warnings[:3])}" if model.warnings else ""
        raise EstimateError("model", f"{repo} has no snapshot in the cache at {root}{why}")
    return model.snapshot(revision)
