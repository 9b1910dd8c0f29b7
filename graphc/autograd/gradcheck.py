"""gradcheck / gradgradcheck: analytical gradients against float64 finite differences.

`gradcheck(fn, inputs)` builds the Jacobian of `fn` two ways: numerically, by central
differences on every element of every float64 input that requires grad, and analytically, by
one `autograd.grad` call per output element. They must agree within `atol + rtol * |numerical|`.
On failure the error shows both Jacobians at the entries that differ. `gradgradcheck` applies
the same check to the function that maps (inputs, grad_outputs) to the first-order gradients.
"""

from __future__ import annotations

import warnings

import numpy as np

from graphc.autograd.grad_mode import enable_grad
from graphc.errors import GraphcError


class GradcheckError(GraphcError, RuntimeError):
    """Analytical and numerical Jacobians differ (or the inputs cannot be checked)."""


def _outputs_of(fn, inputs) -> list:
    from graphc.tensor import Tensor

    out = fn(*inputs)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    return [o for o in outs if isinstance(o, Tensor) and o.dtype.is_floating]


def _check_inputs(inputs) -> list[int]:
    from graphc.tensor import Tensor

    diff = []
    for i, t in enumerate(inputs):
        if isinstance(t, Tensor) and t.requires_grad:
            if t.dtype.name != "float64":
                warnings.warn(
                    f"Input #{i} requires gradient and is not a double precision floating "
                    "point. This check will likely fail if all the inputs are not of double "
                    "precision floating point (use .double()).", UserWarning, stacklevel=3)
            diff.append(i)
    if not diff:
        raise GradcheckError("gradcheck: no input requires grad, nothing to check")
    return diff


def _numerical_jacobians(fn, inputs, diff, eps) -> list[list[np.ndarray]]:
    """jac[i][j]: d(output j)/d(input i) as a (numel_in, numel_out) array."""
    from graphc.autograd.grad_mode import no_grad

    with no_grad():
        outs = _outputs_of(fn, inputs)
    jac = [[np.zeros((inputs[i].numel(), o.numel())) for o in outs] for i in diff]
    for k, i in enumerate(diff):
        data = inputs[i]._data  # edited in place, so fn sees the perturbed input
        for e, idx in enumerate(np.ndindex(data.shape)):
            orig = data[idx]
            with no_grad():
                data[idx] = orig + eps
                plus = [o._data.astype(np.float64).reshape(-1) for o in _outputs_of(fn, inputs)]
                data[idx] = orig - eps
                minus = [o._data.astype(np.float64).reshape(-1) for o in _outputs_of(fn, inputs)]
                data[idx] = orig
            for j in range(len(outs)):
                jac[k][j][e] = (plus[j] - minus[j]) / (2 * eps)
    return jac


def _analytical_jacobians(fn, inputs, diff) -> list[list[np.ndarray]]:
    from graphc.autograd import grad
    from graphc.tensor import Tensor

    with enable_grad():
        outs = _outputs_of(fn, inputs)
    jac = [[np.zeros((inputs[i].numel(), o.numel())) for o in outs] for i in diff]
    for j, out in enumerate(outs):
        if not out.requires_grad:
            continue
        for e in range(out.numel()):
            seed = np.zeros(out.shape, dtype=out.dtype.np)
            seed.reshape(-1)[e] = 1.0
            grads = grad([out], [inputs[i] for i in diff], [Tensor._wrap(seed)],
                         retain_graph=True, allow_unused=True)
            for k, g in enumerate(grads):
                if g is not None:
                    jac[k][j][:, e] = g._data.reshape(-1)
    return jac


def _as_tensor_text(matrix: np.ndarray) -> str:
    from graphc.printing import tensor_repr
    from graphc.tensor import Tensor

    return tensor_repr(Tensor._wrap(np.ascontiguousarray(matrix, dtype=np.float64)))


def _report(i, j, num, ana, bad) -> str:
    """PyTorch's report (both Jacobians in full) plus the entries that differ, listed."""
    rows = [f"Jacobian mismatch for output {j} with respect to input {i},",
            f"numerical:{_as_tensor_text(num)}",
            f"analytical:{_as_tensor_text(ana)}",
            "entries that differ (row: input element, column: output element):"]
    idx = np.argwhere(bad)
    for r, c in idx[:10]:
        rows.append(f"  d out[{c}] / d in[{r}]: numerical {num[r, c]:.8g}, analytical "
                    f"{ana[r, c]:.8g}")
    if len(idx) > 10:
        rows.append(f"  ... and {len(idx) - 10} more entries")
    return "\n".join(rows) + "\n"


def gradcheck(fn, inputs, *, eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3,
              raise_exception: bool = True, **_torch_options) -> bool:
    """Check `fn`'s gradients at `inputs` (a tensor or tuple; float64 ones requiring grad).

    Options of torch.autograd.gradcheck this implementation does not need (nondet_tol,
    check_undefined_grad, fast_mode, ...) are accepted and ignored.

    >>> import graphc
    >>> x = graphc.tensor([0.5, 2.0], dtype=graphc.float64, requires_grad=True)
    >>> graphc.autograd.gradcheck(lambda t: t.exp() * t, (x,))
    True
    """
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    diff = _check_inputs(inputs)
    num = _numerical_jacobians(fn, inputs, diff, eps)
    ana = _analytical_jacobians(fn, inputs, diff)
    for k, i in enumerate(diff):
        for j in range(len(num[k])):
            bad = np.abs(num[k][j] - ana[k][j]) > atol + rtol * np.abs(num[k][j])
            if bad.any():
                if raise_exception:
                    raise GradcheckError(_report(i, j, num[k][j], ana[k][j], bad))
                return False
    return True


def gradgradcheck(fn, inputs, grad_outputs=None, *, eps: float = 1e-6, atol: float = 1e-5,
                  rtol: float = 1e-3, raise_exception: bool = True, **_torch_options) -> bool:
    """Check second derivatives: gradcheck of (inputs, grad_outputs) -> first gradients."""
    from graphc.autograd import grad
    from graphc.tensor import Tensor

    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    diff = _check_inputs(inputs)
    with enable_grad():
        outs = _outputs_of(fn, inputs)
    if grad_outputs is None:
        rng = np.random.default_rng(0)
        grad_outputs = tuple(
            Tensor._wrap(rng.standard_normal(o.shape).astype(o.dtype.np), requires_grad=True)
            for o in outs
        )
    else:
        grad_outputs = (tuple(grad_outputs) if isinstance(grad_outputs, (tuple, list))
                        else (grad_outputs,))
    n_in = len(inputs)

    def first_grads(*args):
        xs, gos = args[:n_in], args[n_in:]
        with enable_grad():
            ys = _outputs_of(fn, xs)
            pairs = [(y, g) for y, g in zip(ys, gos) if y.requires_grad]
            if not pairs:
                return ()
            grads = grad([y for y, _ in pairs], [xs[i] for i in diff], [g for _, g in pairs],
                         create_graph=True, allow_unused=True)
        return tuple(g for g in grads if g is not None)

    return gradcheck(first_grads, inputs + tuple(grad_outputs), eps=eps, atol=atol, rtol=rtol,
                     raise_exception=raise_exception)
