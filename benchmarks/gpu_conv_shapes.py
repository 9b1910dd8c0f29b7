"""gpu_conv_shapes: the cuda backend's convolution forward and input gradient on ResNet-18's
CIFAR batch-32 shapes, per shape, next to PyTorch CUDA (cuDNN, TF32 off).

`python -m benchmarks.gpu_conv_shapes [--quick] [--repeat N]` needs a CUDA GPU, nvcc and
PyTorch built with CUDA; `GRAPHC_CUDA_LIBS=0` times graphc's own kernels only (otherwise the
runtime may hand a pass to cuDNN where cuDNN measured faster, and the row's provider says so).
`--quick` shrinks the batch to 2 so the script can run on the emulation
(`GRAPHC_CUDA=emu`, no torch rows): a check that it runs, not a measurement.

Each row is one stride-1 3x3 convolution (pad 1) of the network, plus the stem (3 -> 64) and
the stride-2 layers' forwards: graphc's time per call is the median of `--repeat` runs of the
compiled graph's launch list (`CudaExecutable.step_times`: device events between steps, so
host work stays out), PyTorch's the median of CUDA-event-timed calls on tensors already on
the device, after a warm-up. GFLOP counts the useful multiply-adds (2 per tap).
"""

from __future__ import annotations

import argparse
import os
import statistics

import numpy as np

# (c_in, c_out, hw, stride): the 3x3 pad-1 convolutions of a CIFAR ResNet-18
SHAPES = ((3, 64, 32, 1), (64, 64, 32, 1), (64, 128, 32, 2), (128, 128, 16, 1),
          (128, 256, 16, 2), (256, 256, 8, 1), (256, 512, 8, 2), (512, 512, 4, 1))


def _graph_text(n: int, c_in: int, c_out: int, hw: int, stride: int) -> str:
    out = (hw - 1) // stride + 1
    attrs = f"stride=({stride}, {stride}), padding=(1, 1), dilation=(1, 1), groups=1"
    x, w, y = (f"f32[{n},{c_in},{hw},{hw}]", f"f32[{c_out},{c_in},3,3]",
               f"f32[{n},{c_out},{out},{out}]")
    return f'''graph @conv(%x: {x}, %w: {w}, %g: {y}) -> ({y}, {x}) {{
  %0: {y} = conv2d[{attrs}](%x, %w)
  %1: {x} = conv2d_input_grad[{attrs}, input_hw=({hw}, {hw})](%g, %w)
  return (%0, %1)
}}'''


def _graphc_times(text: str, arrays, repeat: int) -> tuple[list[float], list[str]]:
    """Seconds of each convolution call (forward, input gradient) and their providers."""
    from graphc.backends import compile as compile_graph
    from graphc.backends.cuda.lowering import Call
    from graphc.ir import parse

    ex = compile_graph(parse(text), "cuda")
    ex.run(*arrays)
    steps = ex.step_times(repeat)  # one per lowered step: keep the convolution calls'
    conv = [seconds for seconds, step in zip(steps, ex.lowered.steps)
            if isinstance(step, Call) and step.function.startswith("gc_conv2d")]
    return conv, ex.conv_providers()


def _torch_times(torch, n, c_in, c_out, hw, stride, repeat: int) -> list[float]:
    x = torch.randn(n, c_in, hw, hw, device="cuda")
    w = torch.randn(c_out, c_in, 3, 3, device="cuda")
    y = torch.nn.functional.conv2d(x, w, stride=stride, padding=1)
    g = torch.randn_like(y)
    ops = (lambda: torch.nn.functional.conv2d(x, w, stride=stride, padding=1),
           lambda: torch.nn.grad.conv2d_input(x.shape, w, g, stride=stride, padding=1))
    times = []
    for op in ops:
        for _ in range(3):
            op()
        samples = []
        for _ in range(repeat):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            op()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        times.append(statistics.median(samples))
    return times


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="batch 2 (runs on the emulation)")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)
    n = 2 if args.quick else 32
    torch = None
    if not args.quick:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("benchmarks.gpu_conv_shapes: PyTorch sees no CUDA device")
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = True
    print(f"GRAPHC_CUDA_LIBS={os.environ.get('GRAPHC_CUDA_LIBS', '(unset)')}, batch {n}")
    print(f"{'layer':>22} {'pass':>10} {'GFLOP':>6} {'graphc us':>10} {'TFLOP/s':>8} "
          f"{'torch us':>9} {'ratio':>6}  provider")
    rng = np.random.default_rng(0)
    for c_in, c_out, hw, stride in SHAPES:
        out = (hw - 1) // stride + 1
        arrays = [rng.standard_normal(s).astype(np.float32) for s in (
            (n, c_in, hw, hw), (c_out, c_in, 3, 3), (n, c_out, out, out))]
        steps, providers = _graphc_times(_graph_text(n, c_in, c_out, hw, stride), arrays,
                                         args.repeat)
        anchors = (_torch_times(torch, n, c_in, c_out, hw, stride, args.repeat) if torch
                   else [float("nan")] * 2)
        flop = 2.0 * n * c_in * c_out * 9 * out * out
        layer = f"{c_in}->{c_out} {hw}x{hw} s{stride}"
        for name, seconds, anchor, provider in zip(("forward", "input grad"), steps, anchors,
                                                   providers):
            provider = provider.split(": ", 1)[-1]
            print(f"{layer:>22} {name:>10} {flop / 1e9:6.2f} {seconds * 1e6:10.1f} "
                  f"{flop / seconds / 1e12:8.1f} {anchor * 1e6:9.1f} "
                  f"{anchor / seconds:6.2f}  {provider[:70]}")


if __name__ == "__main__":
    main()
