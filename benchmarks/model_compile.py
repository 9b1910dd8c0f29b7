"""Compile cost of real training steps: the first calls of the compiled GPT and ResNet-18
steps of benchmarks/model_steps.py, each in a fresh process with an empty cache.

    python -m benchmarks.model_compile

For each model it prints the wall and CPU seconds of the first three calls and how many
graphs were compiled. A training step compiles once (graphc.jit.compiler's warm-up: the
first call, which creates the optimizer state, runs on the interpreter and compiles the
steady graph), so the second call is already a steady step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time


def child(name: str) -> None:
    import graphc
    from benchmarks import models
    from benchmarks.model_steps import FULL, batch_of, gpt, resnet18

    shape = FULL[name]
    graphc.manual_seed(0)
    model = (gpt if name == "gpt" else resnet18)(graphc, **shape)
    x, y = batch_of(name, shape)
    step = graphc.compile(models.graphc_step(model), backend="cpu")
    gx, gy = graphc.tensor(x), graphc.tensor(y)
    calls = []
    for _ in range(3):
        wall, cpu = time.perf_counter(), time.process_time()
        step(gx, gy)
        calls.append((time.perf_counter() - wall, time.process_time() - cpu))
    print("RESULT " + json.dumps({"calls": calls, "graphs": len(step.graphs)}), flush=True)


def main() -> int:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    print(f"command: `python -m benchmarks.model_compile`; load average "
          f"{os.getloadavg()[0]:.2f}\n")
    print("| training step | call 1 (wall / CPU) | call 2 | call 3 | graphs compiled |")
    print("|---|---|---|---|---|")
    for name, label in (("gpt", "GPT (n_embd 128, 4 layers, batch 16)"),
                        ("resnet18", "ResNet-18 CIFAR (batch 32)")):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "GRAPHC_CACHE_DIR": cache,
                   "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
            done = subprocess.run([sys.executable, __file__, "--child", name], env=env,
                                  capture_output=True, text=True, timeout=1800)
        line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            print(done.stdout, done.stderr, sep="\n")
            return 1
        found = json.loads(line[len("RESULT "):])
        cells = [f"{w:.2f} s / {c:.2f} s" for w, c in found["calls"]]
        print(f"| {label} | " + " | ".join(cells) + f" | {found['graphs']} |")
    return 0


if __name__ == "__main__":
    if "--child" in sys.argv:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        child(sys.argv[-1])
    else:
        sys.exit(main())
