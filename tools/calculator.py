"""A calculator tool over a safe arithmetic evaluator.

``safe_eval`` walks the expression's AST and allows only numbers, ``+ - * / // % **``, unary
signs and parentheses. It never calls ``eval``; names, calls, attributes and every other node
are rejected. Sizes are bounded so the model cannot hang the process with ``9**9**9``.
"""

from __future__ import annotations

import ast
import math
import operator

from agentrl import tool

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = 10**30

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorError(ValueError):
    """The expression is not allowed or cannot be evaluated; the message says why."""


def safe_eval(expression: str) -> int | float:
    """Evaluates an arithmetic expression without ``eval``.

    Args:
        expression: e.g. ``"37*12+5"`` or ``"(3 + 4.5) / 2"``.

    Returns:
        The value; a float with an integral value is returned as an int.

    Raises:
        CalculatorError: Syntax errors, disallowed constructs, division by zero, or values and
            exponents beyond the limits.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError) as exc:
        raise CalculatorError(f"not an arithmetic expression: {exc.msg if hasattr(exc, 'msg') else exc}") from None
    value = _eval(tree.body)
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent {right} is larger than {MAX_EXPONENT}")
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("result too large") from None
        if isinstance(value, complex):
            raise CalculatorError("result is not a real number")
        if abs(value) > MAX_MAGNITUDE or (isinstance(value, float) and not math.isfinite(value)):
            raise CalculatorError(f"result beyond +-{MAX_MAGNITUDE:.0e}")
        return value
    raise CalculatorError(f"'{ast.unparse(node)}' is not allowed: use numbers, + - * / // % ** and ()")


@tool(inline=True)
def calculator(expression: str) -> str:
    """Evaluates an arithmetic expression and returns the result.

    Args:
        expression: Numbers with + - * / // % ** and parentheses, e.g. "37*12+5".
    """
    return str(safe_eval(expression))
