"""graphc.ir: typed SSA graphs, their text form (print and parse), verifier and interpreter.

>>> from graphc.ir import parse
>>> g = parse('''
... graph @f(%x: f32[3]) -> (f32[3]) {
...   %0: f32[3] = exp(%x)
...   return (%0)
... }''')
>>> print(g.nodes[0].op)
exp
"""

from graphc.ir.graph import Graph, Node, Value
from graphc.ir.interpreter import Interpreter, InterpreterError, run
from graphc.ir.parser import ParseError, parse
from graphc.ir.printer import format_graph, format_literal, format_node
from graphc.ir.verifier import VerifyError, verify

__all__ = [
    "Graph", "Interpreter", "InterpreterError", "Node", "ParseError", "Value", "VerifyError",
    "format_graph", "format_literal", "format_node", "parse", "run", "verify",
]
