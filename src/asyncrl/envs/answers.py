"""Reading answers out of completions: the last number, a \\boxed{} answer, a safe arithmetic
expression (parsed with `ast`, never `eval`)."""

from __future__ import annotations

import ast
import operator
import re
from fractions import Fraction

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
              ast.Div: operator.truediv}  # fmt: skip


def last_number(text: str) -> str | None:
    found = NUMBER.findall(text)
    return found[-1] if found else None


def boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}`, with nested braces."""
    start = text.rfind("\\boxed{")
    if start == -1:
        return None
    depth, index = 0, start + len("\\boxed{")
    for position in range(index, len(text)):
        if text[position] == "{":
            depth += 1
        elif text[position] == "}":
            if depth == 0:
                return text[index:position].strip()
            depth -= 1
    return None


class ExpressionError(ValueError):
    pass


def evaluate(expression: str) -> tuple[Fraction, list[int]]:
    """Exact value of + - * / over integer literals and parentheses, and the literals used."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as error:
        raise ExpressionError(f"not an expression: {expression!r}") from error
    used: list[int] = []

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and node.value >= 0:
            used.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise ExpressionError("division by zero")
            return _OPERATORS[type(node.op)](left, right)
        raise ExpressionError(f"only + - * / and whole numbers are allowed: {expression!r}")

    return walk(tree.body), used
