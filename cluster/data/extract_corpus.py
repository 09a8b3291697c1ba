"""Rebuilds ``corpus.txt.xz``: English text from CPython's standard library (PSF License).

The tokenizer of the built-in models is trained on this file at make-model time, so the repository
ships the text and training never needs the network. Run with the interpreter whose stdlib to use:
``python cluster/data/extract_corpus.py``. The shipped file came from CPython 3.11.7.
"""

import ast
import io
import lzma
import sysconfig
import tokenize
from pathlib import Path

OUT = Path(__file__).with_name("corpus.txt.xz")
# Test suites, vendored copies and GUI demos add little prose but many odd identifiers.
SKIP_TOP = ("site-packages", "pydoc_data", "lib2to3", "idlelib", "turtledemo")
MIN_COMMENT_CHARS = 20  # shorter comments are mostly code fragments and lint pragmas
DOC_NODES = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _skipped(rel: Path) -> bool:
    top = rel.parts[0]
    return top in SKIP_TOP or top.startswith("config-") or any("test" in p for p in rel.parts)


def _docstrings_and_comments(source: str) -> tuple[list[str], list[str]]:
    docs = [
        d
        for node in ast.walk(ast.parse(source))
        if isinstance(node, DOC_NODES)
        if (d := ast.get_docstring(node))
    ]
    comments = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        text = tok.string.lstrip("#").strip()
        if tok.type == tokenize.COMMENT and len(text) > MIN_COMMENT_CHARS:
            comments.append(text)
    return docs, comments


def main() -> None:
    import pydoc_data.topics  # the reference manual's topic texts, as shown by help()

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    # dicts keep first-seen order and drop repeats (many docstrings are copied between modules)
    docs: dict[str, None] = {}
    comments: dict[str, None] = {}
    for path in sorted(stdlib.rglob("*.py")):
        if _skipped(path.relative_to(stdlib)):
            continue
        try:
            d, c = _docstrings_and_comments(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, tokenize.TokenError):
            continue  # a few stdlib files are deliberately invalid or not UTF-8
        docs.update(dict.fromkeys(d))
        comments.update(dict.fromkeys(c))
    topics = [pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics)]
    text = "\n\n".join([*topics, *docs, "\n".join(comments)]) + "\n"
    OUT.write_bytes(lzma.compress(text.encode("utf-8"), preset=9 | lzma.PRESET_EXTREME))
    print(f"{OUT}: {len(text)} characters, {OUT.stat().st_size} bytes compressed")


if __name__ == "__main__":
    main()
