"""llm-analysis side by side: what ``benchmarks/sweep_speed.py`` and
``benchmarks/user_speed.py`` share to run it.

llm-analysis is not a dependency of MemFit: :func:`bench_python` installs it into
``.bench-venv`` (git-ignored) the first time, and :func:`run` runs ``LLMAnalysis.training``
over a list of configurations in one fresh process of that interpreter, timing the
process from before its start to its first loop's result as well as the loop inside it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import tempfile
import time
import venv
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_VENV = ROOT / ".bench-venv"
LLM_ANALYSIS = "llm-analysis==0.2.2"

#: llm-analysis's ``ModelConfig`` of the models it is compared on
LLAMA_3_8B: dict[str, object] = {
    "name": "llama-3-8b",
    "num_layers": 32,
    "n_head": 32,
    "hidden_dim": 4096,
    "vocab_size": 128256,
    "max_seq_len": 8192,
    "num_key_value_heads": 8,
    "ffn_embed_dim": 14336,
    "expansion_ratio": 3.5,
    "model_type": "llama",
}
LLAMA_3_70B: dict[str, object] = {
    "name": "llama-3-70b",
    "num_layers": 80,
    "n_head": 64,
    "hidden_dim": 8192,
    "vocab_size": 128256,
    "max_seq_len": 8192,
    "num_key_value_heads": 8,
    "ffn_embed_dim": 28672,
    "expansion_ratio": 3.5,
    "model_type": "llama",
}

#: run in ``.bench-venv``'s interpreter with a job file as its argument: ``model`` (the
#: ``ModelConfig`` fields), ``gpu`` (its GPU name), ``rounds``, and ``configs``, each with
#: tp, pp, dp, zero, checkpointing (none, selective, full), micro, seq and accumulation.
#: Prints one JSON line per round, as soon as the round is done: the loop's seconds, how
#: many configurations raised (llm-analysis's way of saying "does not fit") and the
#: seconds its imports took.
SCRIPT = r"""
import time
started = time.perf_counter()
import json, logging, sys
from llm_analysis.analysis import ActivationRecomputation, DSZeRO, LLMAnalysis
from llm_analysis.config import DtypeConfig, ModelConfig, ParallelismConfig, get_gpu_config_by_name
from llm_analysis.logger import logger
imports = time.perf_counter() - started

logger.setLevel(logging.ERROR)
with open(sys.argv[1]) as f:
    job = json.load(f)
model = ModelConfig(**job["model"])
gpu = get_gpu_config_by_name(job["gpu"])
recompute = {"none": ActivationRecomputation.NONE, "selective": ActivationRecomputation.SELECTIVE,
             "full": ActivationRecomputation.FULL}
for _ in range(job["rounds"]):
    failed = 0
    start = time.perf_counter()
    for c in job["configs"]:
        analysis = LLMAnalysis(model, gpu, DtypeConfig(), ParallelismConfig(
            tp_size=c["tp"], pp_size=c["pp"], dp_size=c["dp"]))
        try:
            analysis.training(
                batch_size_per_gpu=c["micro"], gradient_accumulation_steps=c["accumulation"],
                seq_len=c["seq"], activation_recomputation=recompute[c["checkpointing"]],
                ds_zero=DSZeRO(c["zero"]), flash_attn=True, mlp_gated_linear_units=True,
            )
        except (AssertionError, ZeroDivisionError):  # its way of saying "does not fit"
            failed += 1
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "failed": failed, "imports": imports}), flush=True)
"""


@dataclasses.dataclass(frozen=True)
class Run:
    """One process of llm-analysis over a list of configurations."""

    #: wall seconds from before the process was started to its first round's result:
    #: the interpreter's start, the imports, reading the job, one loop
    to_first: float
    #: seconds the imports took, measured inside the process
    imports: float
    #: each round's loop, in seconds, the first one first
    rounds: list[float]
    #: configurations that raised in the last round
    failed: int


def bench_python() -> Path | None:
    """The interpreter of ``.bench-venv`` with llm-analysis installed (made the first
    time); ``None`` if it cannot be installed here."""
    python = BENCH_VENV / "bin" / "python"
    check = [str(python), "-c", "import llm_analysis"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    print(f"  installing {LLM_ANALYSIS} into {BENCH_VENV.name} (once) ...", flush=True)
    try:
        venv.create(BENCH_VENV, with_pip=True, clear=True)
        pip = [str(python), "-m", "pip", "install", "-q", LLM_ANALYSIS]
        subprocess.run(pip, check=True, capture_output=True, timeout=1200)
    except subprocess.CalledProcessError as error:
        tail = (error.stderr or b"").decode(errors="replace").strip().splitlines()[-3:]
        print(f"  could not install {LLM_ANALYSIS}: pip failed: {' / '.join(tail)}")
        return None
    except (OSError, subprocess.SubprocessError) as error:
        print(f"  could not install {LLM_ANALYSIS}: {error}")
        return None
    return python if subprocess.run(check, capture_output=True).returncode == 0 else None


#: what a user's shell does not set: unbuffered output, and no bytecode written
NOT_A_USERS = ("PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE")


def environment() -> dict[str, str]:
    """This process's environment as a user's shell has it: without ``PYTHONUNBUFFERED``
    (a child's output is buffered, as a user's is when piped or written to a file) and
    without ``PYTHONDONTWRITEBYTECODE`` (Python reads the modules' bytecode, as an
    installed package or the packaged app has it: see :func:`bytecode`)."""
    return {k: v for k, v in os.environ.items() if k not in NOT_A_USERS}


def bytecode(package: Path) -> None:
    """The bytecode of every module under ``package`` written, as ``pip install`` writes
    an installed package's (an editable install has it after its first run; the packaged
    app carries it), so that no timed run compiles MemFit's sources."""
    import compileall

    compileall.compile_dir(package, quiet=1)


def run(
    python: Path,
    model: Mapping[str, object],
    configs: Sequence[Mapping[str, object]],
    rounds: int,
    gpu: str = "h100-sxm-80gb",
) -> Run:
    """``LLMAnalysis.training`` over ``configs``, ``rounds`` times, in one fresh process of
    ``python``."""
    job = {"model": dict(model), "gpu": gpu, "rounds": rounds, "configs": list(configs)}
    with tempfile.TemporaryDirectory(prefix="memfit-bench-") as tmp:
        path = Path(tmp) / "job.json"
        path.write_text(json.dumps(job))
        errors = Path(tmp) / "stderr"
        with open(errors, "w+b") as stderr:
            start = time.perf_counter()
            proc = subprocess.Popen(
                [str(python), "-c", SCRIPT, str(path)],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env=environment(),
                cwd=tmp,
            )
            assert proc.stdout is not None
            first = proc.stdout.readline()
            to_first = time.perf_counter() - start
            rest = proc.stdout.read()
            proc.wait()
        if proc.returncode != 0 or not first:
            tail = errors.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"llm-analysis failed ({proc.returncode}): {tail}")
    results = [json.loads(line) for line in [first, *rest.splitlines()] if line.strip()]
    return Run(
        to_first=to_first,
        imports=results[0]["imports"],
        rounds=[r["seconds"] for r in results],
        failed=results[-1]["failed"],
    )
