"""How long a model folder's safetensors headers take to read, by header size.

Writes model folders whose one header holds N tiny tensors (about 110 bytes of JSON
each; real headers hold a few thousand tensors, DeepSeek-V3's largest under 1 MiB) and
times in CPU seconds, best of ``--repeat``:
:func:`memfit.engine.checkpoint.read_safetensors_header` on the
file, and ``memfit checkpoint FOLDER`` in process (every header checked, the tensors
classified and counted against the model). A header over the bound
(:data:`memfit.engine.checkpoint.MAX_HEADER_BYTES`) is refused from its length; the last row
times that refusal for a 60 MB claim.

Run: ``python benchmarks/checkpoint_speed.py [--sizes 10000,100000,140000] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from memfit.engine.checkpoint import MAX_HEADER_BYTES, read_safetensors_header
from memfit.engine.cli import main as memfit
from tests.engine.fuzzing import TINY_CONFIG, expert_tensors


def folder_of(root: Path, tensors: int) -> tuple[Path, int]:
    """A model folder whose one safetensors header holds ``tensors`` 1-element F32
    tensors, named as a large MoE's experts are; the folder and the header's bytes."""
    folder = root / f"m{tensors}"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_CONFIG))
    header = expert_tensors(tensors)
    raw = json.dumps(header).encode()
    with open(folder / "model.safetensors", "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        f.write(bytes(4 * tensors))
    return folder, len(raw)


def best_of(repeat: int, work: Callable[[], object]) -> float:
    """The least CPU time of ``repeat`` runs (CPU, not wall time: a shared machine's
    other work does not count)."""
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        work()
        best = min(best, time.process_time() - start)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,140000")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"{'tensors':>9} {'header MB':>10} {'header CPU s':>13} {'memfit checkpoint CPU s':>24}")
    with tempfile.TemporaryDirectory(prefix="memfit-ckpt-") as tmp:
        for n in sizes:
            folder, size = folder_of(Path(tmp), n)
            if size > MAX_HEADER_BYTES:
                print(f"{n:>9,} {size / 1e6:>10.1f}   over the bound: refused")
                continue
            header = best_of(
                args.repeat, lambda f=folder: read_safetensors_header(f / "model.safetensors")
            )
            cli = best_of(args.repeat, lambda f=folder: _checkpoint(f))
            print(f"{n:>9,} {size / 1e6:>10.1f} {header:>13.3f} {cli:>24.3f}")
        claim = Path(tmp) / "claim.safetensors"
        with open(claim, "wb") as f:
            f.write((60_000_000).to_bytes(8, "little"))
            f.truncate(60_000_100)
        refused = best_of(args.repeat, lambda: _refused(claim))
        print(f"a 60 MB header claim refused from its length in {refused * 1000:.2f} ms")
    return 0


def _checkpoint(folder: Path) -> None:
    code = memfit(["checkpoint", str(folder)], io.StringIO())
    assert code == 0, code


def _refused(path: Path) -> None:
    try:
        read_safetensors_header(path)
    except ValueError:
        return
    raise AssertionError("a 60 MB header was read")


if __name__ == "__main__":
    sys.exit(main())
