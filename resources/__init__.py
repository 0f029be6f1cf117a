"""MemFit's data, not code: the model presets (``models/``), GPU presets (``gpus/``),
training stacks (``stacks/``), the application icons (``icons/``) and the desktop entry
(``desktop/``). Installed as the package ``memfit.resources`` so that
:mod:`importlib.resources` finds it; :mod:`memfit.engine.locate` is the one reader of its
path."""
