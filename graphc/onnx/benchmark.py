"""Inference speed beside onnxruntime: `python -m graphc.onnx.benchmark`.

Two models at batch 1 and 8, each run by graphc compiled on cpu and by onnxruntime (CPU
execution provider) with the same number of threads (OMP_NUM_THREADS, which graphc's loops
and OpenBLAS follow; onnxruntime's intra-op threads are set to it; default 1):
- ResNet-50 from onnx's test data ("light": the real graph, random weights), imported with
  graphc.onnx.load; onnxruntime runs the same file;
- a GPT (nanoGPT's architecture: token and position embeddings, pre-LayerNorm blocks of
  causal self-attention and a GELU MLP, 4 layers, 4 heads, width 256, 128 tokens), written
  with graphc.nn and exported with graphc.onnx.export for onnxruntime.
It prints the median time per call over `--repeat` calls after a warm-up and the ratio
graphc / onnxruntime (below 1: graphc is faster).

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python -m graphc.onnx.benchmark
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np


def _median_time(fn, args: tuple, repeat: int) -> float:
    fn(*args)  # warm-up (the first compiled call also traces and compiles)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _threads() -> int:
    return int(os.environ.get("OMP_NUM_THREADS", "1") or 1)


def _session(model_bytes: bytes):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = _threads()
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return onnxruntime.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])


def resnet50(batch: int):
    """(graphc module, ONNX bytes, input array) for the light ResNet-50 at `batch`."""
    import onnx

    from graphc.onnx.conformance import _light_path
    from graphc.onnx.importer import load

    model = onnx.load(_light_path("resnet50"))
    inits = {i.name for i in model.graph.initializer}
    graph_input = next(i for i in model.graph.input if i.name not in inits)
    graph_input.type.tensor_type.shape.dim[0].dim_value = batch
    for out in model.graph.output:
        out.type.tensor_type.shape.dim[0].dim_value = batch
    # the file flattens with a constant [1, 2048]: let that Reshape follow the batch
    shapes = {n.input[1] for n in model.graph.node if n.op_type == "Reshape"}
    for i, init in enumerate(model.graph.initializer):
        if init.name in shapes:
            target = onnx.numpy_helper.to_array(init).copy()
            if target[0] == 1:
                target[0] = batch
                model.graph.initializer[i].CopyFrom(onnx.numpy_helper.from_array(target,
                                                                                 init.name))
    shape = [d.dim_value for d in graph_input.type.tensor_type.shape.dim]
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    return load(model), model.SerializeToString(), x


def gpt(batch: int, layers: int = 4, heads: int = 4, width: int = 256, tokens: int = 128,
        vocab: int = 512):
    """(graphc module, ONNX bytes of its export, token ids) for a nanoGPT-style model."""
    import graphc
    import graphc.nn as nn
    import graphc.nn.functional as F
    from graphc.onnx.exporter import to_model

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
            return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(tokens, width)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)

        def forward(self, idx):
            x = self.wte(idx) + self.wpe(graphc.arange(0, idx.shape[1]))
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln(x))

    graphc.manual_seed(0)
    model = GPT().eval()
    idx = np.random.default_rng(0).integers(0, vocab, size=(batch, tokens))
    proto = to_model(model, (graphc.tensor(idx),))
    return model, proto.SerializeToString(), idx


def run(models=("resnet50", "gpt"), batches=(1, 8), repeat: int = 10) -> list[dict]:
    """Time each model and batch in graphc (compiled on cpu) and onnxruntime."""
    import graphc
    from graphc.jit import compile as graphc_compile

    rows = []
    for name in models:
        for batch in batches:
            module, onnx_bytes, x = {"resnet50": resnet50, "gpt": gpt}[name](batch)
            compiled = graphc_compile(module, backend="cpu")
            xt = graphc.tensor(x)
            with graphc.no_grad():
                got = compiled(xt).numpy()
                graphc_s = _median_time(compiled, (xt,), repeat)
            session = _session(onnx_bytes)
            feed = {session.get_inputs()[0].name: x}
            want = session.run(None, feed)[0]
            ort_s = _median_time(session.run, (None, feed), repeat)
            scale = float(np.abs(want).max()) or 1.0
            rows.append(dict(model=name, batch=batch, graphc_ms=graphc_s * 1e3,
                             ort_ms=ort_s * 1e3, ratio=graphc_s / ort_s,
                             max_rel_diff=float(np.abs(got - want).max()) / scale))
    return rows


def main(argv: list[str] | None = None) -> None:
    """Command line: print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--models", default="resnet50,gpt")
    parser.add_argument("--batches", default="1,8")
    args = parser.parse_args(argv)
    rows = run(args.models.split(","), [int(b) for b in args.batches.split(",")], args.repeat)
    print(f"threads: {_threads()} (OMP_NUM_THREADS; onnxruntime intra-op threads the same)")
    print(f"{'model':10} {'batch':>5} {'graphc ms':>10} {'ort ms':>9} {'ratio':>6}  max rel diff")
    for r in rows:
        print(f"{r['model']:10} {r['batch']:>5} {r['graphc_ms']:>10.2f} {r['ort_ms']:>9.2f} "
              f"{r['ratio']:>6.2f}  {r['max_rel_diff']:.1e}")


if __name__ == "__main__":
    main()
