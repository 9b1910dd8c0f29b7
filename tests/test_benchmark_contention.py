"""benchmarks.contention's thread table: graphc's four figures per training step, its
contended figure over its own 1-thread figure (flagged past the issue's 1.2x) and over one
thread's contended figure."""

from benchmarks.contention import thread_table


def _run(load: str, **figures: float) -> dict:
    cases = [{"name": name, "description": name.upper(), "graphc": "graphc cpu",
              "contenders": [{"name": "torch eager", "figure": 1.0},
                             {"name": "graphc cpu", "figure": ms}]}
             for name, ms in figures.items()]
    return {"header": f"command: x; load average at the end {load}; clock: wall",
            "cases": cases}


def test_the_table_divides_the_contended_figure_by_the_one_thread_figure():
    table = thread_table([_run("0.50 0.40 0.30", mlp=2.0, vae=0.5),
                          _run("0.60 0.40 0.30", mlp=1.5, vae=0.4),
                          _run("1.60 0.90 0.40", mlp=2.2, vae=0.75),
                          _run("1.70 1.00 0.50", mlp=2.0, vae=0.75)])
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()
            if line.startswith("| MLP") or line.startswith("| VAE")}
    assert rows["MLP"].endswith("| 2.00 ms | 1.50 ms | 2.20 ms | 2.00 ms | 1.10x | 1.10x |")
    assert rows["VAE"].endswith(
        "| 0.500 ms | 0.400 ms | 0.750 ms | 0.750 ms | 1.50x **over 1.2x** | 1.00x |")
    assert "2 threads, wall, one core busy: 1.60 0.90 0.40" in table
    assert "1 thread, wall, one core busy: 1.70 1.00 0.50" in table


def test_a_run_left_out_shows_as_a_dash():
    table = thread_table([_run("0.50 0.40 0.30", mlp=2.0), _run("0.60 0.40 0.30", mlp=1.5),
                          _run("1.60 0.90 0.40", mlp=2.2)])
    row = next(line for line in table.splitlines() if line.startswith("| MLP"))
    assert row.endswith("| 2.20 ms | - | 1.10x | - |")



def test_the_in_process_measurement_resets_the_optimizers_a_step_closes_over():
    """benchmarks.contention_steps puts back the weights and the optimizer state before every
    sample: the Adam steps of benchmarks/family_steps.py hold their optimizer in a closure."""
    import graphc
    from benchmarks import family_steps
    from benchmarks.contention_steps import state_arrays

    model, step = family_steps.build(graphc, "vae", family_steps.QUICK["vae"])
    args = [graphc.tensor(a) for a in family_steps.batch("vae", family_steps.QUICK["vae"])]
    step(*args)  # creates Adam's moments
    parameters = len(list(model.parameters()))
    arrays = state_arrays(model, step)
    assert len(arrays) >= 3 * parameters  # each parameter, its two moments
    before = [a.copy() for a in arrays]
    step(*args)
    assert all(a.shape == b.shape for a, b in zip(arrays, before))
    assert any(not (a == b).all() for a, b in zip(arrays[parameters:], before[parameters:]))
