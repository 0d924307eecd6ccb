"""A shell script split into words and operators, each word with its place in the script.

Enough of POSIX sh for launch scripts: single and double quotes, backslash escapes and
line continuations, comments, ``$(...)``, backticks, ``${...}`` and Helm's ``{{ ... }}``
kept whole inside a word, the operators ``; & && || | ( )``, newlines, redirections
(``>``, ``2>&1``, ``< /dev/null``) and here-documents (their bodies skipped). No command
is run and nothing is expanded here (:mod:`.expand` does that).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["LexError", "Op", "Word", "WordPart", "lex"]

_OPERATORS = ("&&", "||", ";;", ">>", "<<-", "<<", ">&", "<&", "&>>", "&>", "|&", ";", "&",
              "|", "(", ")", "<", ">")
_REDIRECTS = frozenset({">>", "<<-", "<<", ">&", "<&", "&>>", "&>", "<", ">"})
_BLANKS = " \t\r"
_PLAIN = re.compile(r"[^\s\\'\"$`{;&|()<>]+")


class LexError(ValueError):
    """A script that does not split: an unterminated quote or substitution, at ``offset``."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


class WordLimit(LexError):
    """More words than the caller reads (an args file of more arguments than check's)."""


@dataclass(frozen=True)
class WordPart:
    """A piece of a word: ``kind`` is "bare" (unquoted), "dq" (in double quotes) or
    "lit" (single-quoted or backslash-escaped: never expanded)."""

    text: str
    kind: str


@dataclass(frozen=True)
class Word:
    """A word as written: its parts (quotes removed) and its ``[start, end)`` in the script."""

    parts: tuple[WordPart, ...]
    start: int
    end: int

    @property
    def typed(self) -> str:
        """The word with its quotes removed and nothing expanded."""
        return "".join(part.text for part in self.parts)


@dataclass(frozen=True)
class Op:
    """An operator, a newline ("\\n") or a redirection (``redirect`` true)."""

    text: str
    start: int

    @property
    def redirect(self) -> bool:
        return self.text in _REDIRECTS


class _Lexer:
    def __init__(self, text: str, max_words: int | None) -> None:
        self.text = text
        self.max_words = max_words
        self.words = 0
        self.i = 0
        self.out: list[Word | Op] = []
        self.parts: list[WordPart] = []
        self.buf: list[str] = []
        self.kind = "bare"
        self.start = -1
        self.heredocs: list[tuple[str, bool]] = []
        self.want_delimiter: bool | None = None  # after << (False) or <<- (True)

    # -- building words
    def add(self, text: str, kind: str) -> None:
        if self.start < 0:
            self.start = self.i
        if kind != self.kind:
            self.flush_part()
            self.kind = kind
        self.buf.append(text)

    def flush_part(self) -> None:
        if self.buf:
            self.parts.append(WordPart("".join(self.buf), self.kind))
            self.buf = []

    def end_word(self) -> None:
        self.flush_part()
        if self.start >= 0:
            word = Word(tuple(self.parts), self.start, self.i)
            if self.want_delimiter is not None:
                self.heredocs.append((word.typed, self.want_delimiter))
                self.want_delimiter = None
            self.out.append(word)
            self.words += 1
            if self.max_words is not None and self.words > self.max_words:
                raise WordLimit(f"more than {self.max_words:,} words", word.start)
        self.parts, self.start, self.kind = [], -1, "bare"

    # -- scanning
    def run(self) -> list[Word | Op]:
        text = self.text
        while self.i < len(text):
            ch = text[self.i]
            if ch == "\\":
                self.backslash()
            elif ch in _BLANKS:
                self.end_word()
                self.i += 1
            elif ch == "\n":
                self.end_word()
                self.out.append(Op("\n", self.i))
                self.i += 1
                self.skip_heredocs()
            elif ch == "#" and self.start < 0:
                end = text.find("\n", self.i)
                self.i = len(text) if end < 0 else end
            elif ch == "'":
                self.single()
            elif ch == '"':
                self.double()
            elif ch in "$`{" and self.unit(ch):
                pass
            elif ch in ";&|()<>":
                self.operator()
            else:  # a run of plain characters at once
                match = _PLAIN.match(text, self.i)
                end = match.end() if match else self.i + 1
                self.add(text[self.i:end], "bare")
                self.i = end
        self.end_word()
        return self.out

    def backslash(self) -> None:
        nxt = self.text[self.i + 1:self.i + 2]
        if nxt == "\n" or self.text[self.i + 1:self.i + 3] == "\r\n":
            self.i += 2 if nxt == "\n" else 3  # a line continuation
        elif nxt:
            self.add(nxt, "lit")
            self.i += 2
        else:
            self.i += 1

    def single(self) -> None:
        end = self.text.find("'", self.i + 1)
        if end < 0:
            raise LexError("unterminated single quote", self.i)
        if self.start < 0:
            self.start = self.i
        self.add(self.text[self.i + 1:end], "lit")
        self.i = end + 1

    def double(self) -> None:
        opened, text = self.i, self.text
        if self.start < 0:
            self.start = self.i
        self.i += 1
        while self.i < len(text):
            ch = text[self.i]
            if ch == '"':
                self.i += 1
                if not self.buf and self.kind != "dq":
                    self.add("", "dq")  # "" is an (empty) word of its own
                return
            if ch == "\\" and text[self.i + 1:self.i + 2] in ('"', "\\", "$", "`", "\n"):
                if text[self.i + 1] != "\n":
                    self.add(text[self.i + 1], "lit")
                self.i += 2
            elif ch in "$`" and self.unit(ch, "dq"):
                pass
            else:
                self.add(ch, "dq")
                self.i += 1
        raise LexError("unterminated double quote", opened)

    def unit(self, ch: str, kind: str = "bare") -> bool:
        """``$(...)``, backticks, ``${...}`` or ``{{ ... }}`` kept whole in the word."""
        text, i = self.text, self.i
        if ch == "$" and text.startswith("$(", i):
            end = _closing(text, i + 2, "(", ")")
        elif ch == "$" and text.startswith("${", i):
            end = _closing(text, i + 2, "{", "}")
        elif ch == "`":
            end = text.find("`", i + 1) + 1 or -1
        elif ch == "{" and text.startswith("{{", i):
            end = text.find("}}", i + 2)
            end = -1 if end < 0 else end + 2
        else:
            return False
        if end < 0:
            raise LexError(f"unterminated {text[i:i + 2]}", i)
        self.add(text[i:end], kind)
        self.i = end
        return True

    def operator(self) -> None:
        text, i = self.text, self.i
        op = next(o for o in _OPERATORS if text.startswith(o, i))
        fd = self.start >= 0 and op in _REDIRECTS and not self.parts and self.kind == "bare" \
            and "".join(self.buf).isdigit()
        if fd:  # 2>&1: the digits are the redirection's file descriptor
            self.buf, self.start = [], -1
        else:
            self.end_word()
        self.out.append(Op(op, i))
        self.i = i + len(op)
        if op in ("<<", "<<-"):
            self.want_delimiter = op == "<<-"

    def skip_heredocs(self) -> None:
        """After a newline, the bodies of the here-documents opened on that line."""
        for delimiter, strip_tabs in self.heredocs:
            while self.i < len(self.text):
                end = self.text.find("\n", self.i)
                end = len(self.text) if end < 0 else end
                line = self.text[self.i:end]
                self.i = min(end + 1, len(self.text))
                if (line.lstrip("\t") if strip_tabs else line).rstrip("\r") == delimiter:
                    break
        self.heredocs = []


def _closing(text: str, i: int, opening: str, closing: str) -> int:
    """The offset after the ``closing`` that balances an ``opening`` before ``i``
    (quotes inside are skipped), or -1."""
    depth = 1
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch in "'\"":
            end = text.find(ch, i + 1)
            if end < 0:
                return -1
            i = end + 1
            continue
        if ch == opening:
            depth += 1
        elif ch == closing:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1


def lex(text: str, max_words: int | None = None) -> list[Word | Op]:
    """The words and operators of ``text``; :class:`LexError` where it does not split,
    :class:`WordLimit` past ``max_words`` words."""
    return _Lexer(text, max_words).run()
