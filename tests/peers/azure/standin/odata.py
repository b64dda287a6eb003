"""OData $filter: a small parser for what the list-tasks filter needs
(comparisons on property paths, startswith/endswith, and/or/not, parens)."""

import re

_TOKEN = re.compile(
    r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<dt>datetime'[^']*')|(?P<num>-?\d+(?:\.\d+)?)"
    r"|(?P<punct>[(),])|(?P<word>[A-Za-z_$][A-Za-z0-9_/$.]*))"
)
_CMP = {"eq", "ne", "gt", "ge", "lt", "le"}


class FilterError(Exception):
    pass


def _tokenize(text):
    pos, out = 0, []
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        mt = _TOKEN.match(text, pos)
        if not mt or mt.end() == pos:
            raise FilterError(f"unexpected text at offset {pos}: {text[pos:pos + 20]!r}")
        pos = mt.end()
        if mt.group("str") is not None:
            out.append(("lit", mt.group("str")[1:-1].replace("''", "'")))
        elif mt.group("dt") is not None:
            out.append(("lit", mt.group("dt")[9:-1]))
        elif mt.group("num") is not None:
            n = mt.group("num")
            out.append(("lit", float(n) if "." in n else int(n)))
        elif mt.group("punct") is not None:
            out.append((mt.group("punct"), None))
        else:
            w = mt.group("word")
            lw = w.lower()
            if lw in ("and", "or", "not") or lw in _CMP:
                out.append((lw, None))
            elif lw in ("true", "false"):
                out.append(("lit", lw == "true"))
            elif lw == "null":
                out.append(("lit", None))
            else:
                out.append(("name", w))
    return out


class _Parser:
    FUNCS = {"startswith", "endswith"}

    def __init__(self, text):
        self.toks = _tokenize(text)
        self.i = 0

    def peek(self):
        return self.toks[self.i][0] if self.i < len(self.toks) else None

    def take(self, kind=None):
        if self.i >= len(self.toks):
            raise FilterError("unexpected end of filter")
        tok = self.toks[self.i]
        if kind is not None and tok[0] != kind:
            raise FilterError(f"expected {kind!r}, found {tok[0]!r} {tok[1] or ''}".strip())
        self.i += 1
        return tok

    def parse(self):
        node = self.or_()
        if self.i != len(self.toks):
            raise FilterError(f"unexpected {self.toks[self.i][0]!r} {self.toks[self.i][1] or ''}".strip())
        return node

    def or_(self):
        node = self.and_()
        while self.peek() == "or":
            self.take()
            node = ("or", node, self.and_())
        return node

    def and_(self):
        node = self.not_()
        while self.peek() == "and":
            self.take()
            node = ("and", node, self.not_())
        return node

    def not_(self):
        if self.peek() == "not":
            self.take()
            return ("not", self.not_())
        return self.cmp()

    def operand(self):
        k = self.peek()
        if k == "lit":
            return ("lit", self.take()[1])
        if k == "name":
            name = self.take()[1]
            if name.lower() in self.FUNCS and self.peek() == "(":
                self.take("(")
                a = self.operand()
                self.take(",")
                b = self.operand()
                self.take(")")
                return ("fn", name.lower(), a, b)
            return ("prop", name)
        raise FilterError(f"expected a property or literal, found {k!r}")

    def cmp(self):
        if self.peek() == "(":
            self.take()
            node = self.or_()
            self.take(")")
            return node
        left = self.operand()
        if self.peek() in _CMP:
            op = self.take()[0]
            return ("cmp", op, left, self.operand())
        if left[0] == "fn":
            return left
        raise FilterError("expected a comparison (eq, ne, gt, ge, lt, le) or a function")


def parse_filter(text):
    return _Parser(text).parse()


def _value(node, obj):
    if node[0] == "lit":
        return node[1]
    if node[0] == "prop":
        cur = obj
        for part in node[1].split("/"):
            if not isinstance(cur, dict):
                return None
            cur = cur.get(part)
        return cur
    if node[0] == "fn":
        a, b = _value(node[2], obj), _value(node[3], obj)
        if not isinstance(a, str) or not isinstance(b, str):
            return False
        return a.startswith(b) if node[1] == "startswith" else a.endswith(b)
    return eval_filter(node, obj)


def eval_filter(node, obj):
    kind = node[0]
    if kind == "or":
        return eval_filter(node[1], obj) or eval_filter(node[2], obj)
    if kind == "and":
        return eval_filter(node[1], obj) and eval_filter(node[2], obj)
    if kind == "not":
        return not eval_filter(node[1], obj)
    if kind == "fn":
        return bool(_value(node, obj))
    if kind == "cmp":
        op, a, b = node[1], _value(node[2], obj), _value(node[3], obj)
        if op == "eq":
            return a == b
        if op == "ne":
            return a != b
        if a is None or b is None:
            return False
        try:
            return {"gt": a > b, "ge": a >= b, "lt": a < b, "le": a <= b}[op]
        except TypeError:
            return False
    raise FilterError(f"cannot evaluate {kind}")
