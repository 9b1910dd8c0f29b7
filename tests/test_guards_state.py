"""Guards on what a trace read beyond its arguments: module globals, class attributes and
methods of the modules it calls (issue 15: each of these used to keep the first trace and
return stale numbers). A change retraces; no change keeps the one trace."""

import graphc
import graphc.nn as nn

SCALE = 2.0


def _scaled(x):
    return x * SCALE


class _Scaled(nn.Module):
    factor = 3.0

    def helper(self, x):
        return x * self.factor

    def forward(self, x):
        return self.helper(x)


def test_a_module_global_read_by_the_function_is_guarded():
    global SCALE
    f = graphc.compile(_scaled, backend="interp")
    x = graphc.ones(2)
    try:
        assert f(x).tolist() == [2.0, 2.0]
        SCALE = 5.0
        assert f(x).tolist() == [5.0, 5.0]
    finally:
        SCALE = 2.0
    assert len(f.graphs) == 2


def test_class_attributes_and_replaced_methods_retrace():
    class Model(_Scaled):
        pass

    m = graphc.compile(Model(), backend="interp")
    x = graphc.ones(2)
    assert m(x).tolist() == [3.0, 3.0]
    assert m(x).tolist() == [3.0, 3.0] and len(m.graphs) == 1  # nothing changed: one trace
    Model.factor = 7.0
    assert m(x).tolist() == [7.0, 7.0]
    Model.helper = lambda self, x: x + 100
    assert m(x).tolist() == [101.0, 101.0]
    Model.forward = lambda self, x: x - 1
    assert m(x).tolist() == [0.0, 0.0]
    assert len(m.graphs) == 4
    assert any("factor" in " ".join(r) for r in m.recompile_reasons)


t = 1.0  # a global that shares its name with the attribute `Tensor.t`
WEIGHTS = [1.0, 2.0]


def _uses_the_attribute(x):
    return x.t() * 2


def _reads_a_global_in_a_comprehension(x):
    return sum([x * w for w in WEIGHTS])


def test_a_global_named_like_an_attribute_is_not_guarded():
    """`x.t()` reads the attribute `t`, not the global `t`: changing the global must not
    retrace (co_names lists both kinds of name)."""
    global t
    f = graphc.compile(_uses_the_attribute, backend="interp")
    x = graphc.ones(2, 2)
    try:
        for value in (2.0, 3.0, 4.0):
            t = value
            f(x)
    finally:
        t = 1.0
    assert len(f.graphs) == 1


def test_a_global_read_in_a_comprehension_is_guarded():
    global WEIGHTS
    f = graphc.compile(_reads_a_global_in_a_comprehension, backend="interp")
    x = graphc.ones(2)
    try:
        assert f(x).tolist() == [3.0, 3.0]
        WEIGHTS = [1.0, 5.0]
        assert f(x).tolist() == [6.0, 6.0]
    finally:
        WEIGHTS = [1.0, 2.0]
    assert len(f.graphs) == 2
