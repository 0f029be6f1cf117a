"""MemFit's estimator: how much GPU memory one training step takes, and where it goes.

A map of the package (no module here imports Qt):

* :mod:`memfit.engine.specs` -- the frozen, validated inputs: ``ModelSpec``, ``GpuSpec``,
  ``HardwareSpec``, ``TrainingSpec`` and ``Scenario``;
* :mod:`memfit.engine.errors` -- ``EstimateError``, the one error for bad input;
* :mod:`memfit.engine.locate` -- where the data is: the built-in ``resources/``, the user's
  own presets;
* :mod:`memfit.engine.presets` -- model and GPU presets, built-in and the user's own;
* :mod:`memfit.engine.hf_config` -- Hugging Face ``config.json`` to ``ModelSpec``, a reader per
  family;
* :mod:`memfit.engine.hub_cache` -- the models of the local Hugging Face cache;
* :mod:`memfit.engine.checkpoint` -- a model folder's safetensors headers and their counts;
* :mod:`memfit.engine.train_configs` -- the run's own training configuration (Axolotl, TRL,
  LitGPT, torchtune, DeepSpeed, accelerate) into a scenario's fields;
* :mod:`memfit.engine.imports` -- one entry point for everything a user brings, for the app and
  the CLI;
* :mod:`memfit.engine.stacks` -- the conventions of the training stacks;
* :mod:`memfit.engine.params` -- every parameter tensor, exact counts by component;
* :mod:`memfit.engine.model_state` -- weights, gradients and optimizer states per tensor;
* :mod:`memfit.engine.estimate` -- ``estimate(scenario) -> Estimate``;
* :mod:`memfit.engine.changes` -- the changes a user can make to a scenario, each with its one
  rule for when it applies: what the what-ifs, make-it-fit, the remedies and the sweep offer;
* :mod:`memfit.engine.scenario_io` -- ``*.memfit.json`` files: strict load, atomic save;
* :mod:`memfit.engine.cli` -- the ``memfit`` command line;
* :mod:`memfit.engine.memo` -- every cache of the engine, safe under threads, and ``memo.clear()``
  that empties them all.

>>> from memfit.engine import estimate, load_scenario_dict
>>> est = estimate(load_scenario_dict({"memfit_scenario": 1, "model": {"preset": "gpt2"},
...                                    "hardware": {"gpu": "rtx-4090"}}))
>>> est.total_params, est.verdict
(124439808, 'fits')
"""

from memfit.engine.errors import EstimateError
from memfit.engine.estimate import Estimate, estimate
from memfit.engine.scenario_io import load_scenario, save_scenario
from memfit.engine.scenario_io import scenario_from_dict as load_scenario_dict
from memfit.engine.specs import GpuSpec, HardwareSpec, ModelSpec, Scenario, TrainingSpec

__all__ = [
    "Estimate",
    "EstimateError",
    "GpuSpec",
    "HardwareSpec",
    "ModelSpec",
    "Scenario",
    "TrainingSpec",
    "estimate",
    "load_scenario",
    "load_scenario_dict",
    "save_scenario",
]
