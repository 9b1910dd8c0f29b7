"""graphc.tools: what people run, on top of everything else.

- `cli`: the `graphc` command line (`graphc dump`, `viz`, `run`, `check`, `cache`, `demo`,
  `ops`, `build-runtime`); the console script `graphc` is `graphc.tools.cli:main`.
- `demo`, `demo_model`, `demo_bench`, `demo_outputs`: `graphc demo`, a small CNN trained on
  scikit-learn's digits with one compiled training step; `demo_model` holds what the other
  three share (the model, the step, DemoError), so they import it and not each other.
- `memory_viz`: the picture of a memory plan (`render_memory`, matplotlib).

Nothing else in graphc imports this package; importing it loads no optional dependency
(scikit-learn, tqdm, matplotlib and torch are imported when a command needs them).
"""
