"""A multilingual corpus from what a Debian machine already holds: translated manual pages and the Linux kernel's
translated documentation, as JSON lines `{"text": ..., "lang": ...}`, one document per page.

    python -m bertdist.data.manpages --output runs/multilingual          # every language found
    python -m bertdist.data.manpages --output runs/ml --languages de fr ja --max-docs-per-language 200

(`scripts/multilingual_corpus.py` runs the same from a source checkout; `bertdist demo --multilingual` uses it.)

Manual pages: /usr/share/man/man*/ (English) and /usr/share/man/<lang>/man*/ (manpages-de, -fr, -es, -ja, -zh
and the translations other packages ship), rendered by `groff -k -man -Tutf8` with hyphenation off and long lines,
headings and the running header and footer dropped, each paragraph one line. Without groff a plain reader strips
the roff requests and escapes (rougher text; the script says so). A page that is only `.so other-page` is an
alias, not a document. Kernel documentation: Documentation/translations/<lang>/ under /usr/share/doc/linux-doc*
or /usr/src/linux* (the `linux-doc` package or a kernel source tree), one .rst or .txt file per document.

Writes OUTPUT/<lang>/manpages.jsonl and OUTPUT/<lang>/kernel-docs.jsonl, so that `bertdist prepare` takes the
language either from the `lang` field (`--language-field lang`) or from the directory (`--languages-from-dirs`).
Every page that could not be rendered, or rendered to no text, is counted and reported per language: nothing is
dropped silently. No network access: only files already on the machine. The output depends only on the pages
found and the options (sorted paths, the first `--max-docs-per-language` of each language).
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

MAN_ROOT = "/usr/share/man"
KERNEL_DOC_GLOBS = (
    "/usr/share/doc/linux-doc*/Documentation/translations",
    "/usr/src/linux*/Documentation/translations",
)
KERNEL_LANGUAGES = {"zh_CN": "zh_CN", "zh_TW": "zh_TW", "it_IT": "it", "ja_JP": "ja", "ko_KR": "ko", "sp_SP": "es"}
"""The kernel's translation directories -> the language names the manual pages use (zh_CN and zh_TW stay apart:
simplified and traditional script)."""
MIN_DOCUMENT_CHARS = 200
"""A rendered page shorter than this is a stub (an alias without `.so`, an empty translation), reported as one."""
RENDER_TIMEOUT_SECONDS = 60


@dataclass
class LanguageCounts:
    documents: int = 0
    chars: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    """Reason -> pages."""

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def man_pages(man_root: str) -> dict[str, list[str]]:
    """Language -> its compressed man pages, sorted; English from man_root/man*/, others from man_root/<lang>/."""
    found: dict[str, list[str]] = {"en": sorted(glob.glob(os.path.join(man_root, "man*", "*.gz")))}
    for entry in sorted(os.listdir(man_root)) if os.path.isdir(man_root) else []:
        if entry.startswith("man") or not os.path.isdir(os.path.join(man_root, entry)):
            continue
        language = entry.split(".")[0]  # de.UTF-8 -> de
        found.setdefault(language, []).extend(sorted(glob.glob(os.path.join(man_root, entry, "man*", "*.gz"))))
    return {language: pages for language, pages in found.items() if pages}


def kernel_docs(roots: list[str]) -> dict[str, list[str]]:
    """Language -> the .rst/.txt files of Documentation/translations/<dir>/ under each root, sorted."""
    found: dict[str, list[str]] = {}
    for root in roots:
        for directory, language in KERNEL_LANGUAGES.items():
            files = glob.glob(os.path.join(root, directory, "**", "*.rst"), recursive=True)
            files += glob.glob(os.path.join(root, directory, "**", "*.txt"), recursive=True)
            found.setdefault(language, []).extend(sorted(files))
    return {language: files for language, files in found.items() if files}


def render_man_page(path: str, groff: str | None) -> tuple[str, str]:
    """(text, "") or ("", why it has none)."""
    try:
        with gzip.open(path, "rb") as f:
            source = f.read()
    except (OSError, EOFError) as e:
        return "", f"unreadable ({type(e).__name__})"
    if re.fullmatch(rb"(\.\\\".*\n|\s)*\.so\s+\S+\s*", source):
        return "", "alias (.so)"
    if groff is None:
        try:
            return _strip_roff(source.decode("utf-8")), ""
        except UnicodeDecodeError:
            return "", "not UTF-8"
    try:
        done = subprocess.run(
            [groff, "-k", "-Kutf-8", "-t", "-man", "-Tutf8", "-P-cbou", "-rLL=1000n", "-rHY=0"],
            input=source,
            capture_output=True,
            timeout=RENDER_TIMEOUT_SECONDS,
            cwd=os.path.dirname(os.path.dirname(path)),  # `.so man1/x.1` is relative to the section's parent
        )
    except subprocess.TimeoutExpired:
        return "", "groff timed out"
    if done.returncode != 0:
        return "", "groff failed"
    try:
        rendered = done.stdout.decode("utf-8")
    except UnicodeDecodeError:
        return "", "groff output not UTF-8"
    return _paragraphs(rendered), ""


BODY_INDENT = 7
"""The columns groff's man macros indent body text by (IN, 7n); a .SS sub-heading sits at 3 (SN)."""


def _paragraphs(rendered: str) -> str:
    """groff's page -> one line per paragraph. Body text is indented by BODY_INDENT or more; headings (.SH at
    column 0, .SS at 3), the running header and the footer are not sentences: a .SS sub-heading read as body was
    glued onto its section's first sentence."""
    return _joined(
        line.strip() if line.strip() and len(line) - len(line.lstrip()) >= BODY_INDENT else None
        for line in rendered.splitlines()
    )


def _joined(lines: Iterable[str | None]) -> str:
    """Text lines -> one line per paragraph; None ends a paragraph."""
    paragraphs, current = [], []
    for line in [*lines, None]:
        if line is not None:
            current.append(line)
        elif current:
            paragraphs.append(" ".join(current))
            current = []
    return "\n".join(paragraphs)


_ROFF_ESCAPES = re.compile(r"\\(f(\[[^]]*\]|\(..|.)|\(..|\[[^]]*\]|s[-+]?\d+|[&|^%:c]|.)")
_ROFF_CHARACTERS = {"-": "-", "e": "\\", " ": " ", "~": " ", "0": " "}


def _strip_roff(source: str) -> str:
    """Plain text from roff without groff: text lines and the arguments of font and heading macros kept,
    other requests and comments dropped, escapes removed (named characters lost). Rougher than groff's."""

    def lines() -> Iterator[str | None]:
        for line in source.splitlines():
            if line.startswith((".", "'")):
                request, _, rest = line[1:].strip().partition(" ")
                if request in ("B", "I", "BR", "IR", "RB", "RI", "BI", "IB", "SM", "SB") and rest:
                    yield rest.replace('"', "")
                elif request in ("SH", "SS", "PP", "P", "LP", "TP", "IP", "sp", "br"):
                    yield None
            else:
                yield line.strip() or None

    return _ROFF_ESCAPES.sub(lambda m: _ROFF_CHARACTERS.get(m.group(1), ""), _joined(lines()))


def read_kernel_doc(path: str) -> tuple[str, str]:
    """(text, "") or ("", why it has none): reStructuredText with its markup lines (directives, underlines,
    comments) dropped and each paragraph on one line."""
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
    except (OSError, UnicodeDecodeError) as e:
        return "", f"unreadable ({type(e).__name__})"
    paragraphs, current = [], []
    for line in source.splitlines():
        stripped = line.strip()
        markup = stripped.startswith(("..", ":")) or (len(stripped) > 2 and len(set(stripped)) == 1)
        if stripped and not markup:
            current.append(stripped)
        elif current:
            paragraphs.append(" ".join(current))
            current = []
    if current:
        paragraphs.append(" ".join(current))
    return "\n".join(paragraphs), ""


def write_language(
    language: str, kind: str, paths: list[str], render, output_dir: str, jobs: int, counts: LanguageCounts
) -> None:
    """Render `paths` (in parallel, written in path order) into OUTPUT/<language>/<kind>.jsonl."""
    os.makedirs(os.path.join(output_dir, language), exist_ok=True)
    with (
        ThreadPoolExecutor(max_workers=jobs) as pool,
        open(os.path.join(output_dir, language, f"{kind}.jsonl"), "w", encoding="utf-8") as out,
    ):
        for text, reason in pool.map(render, paths):
            if not reason and len(text) < MIN_DOCUMENT_CHARS:
                reason = f"shorter than {MIN_DOCUMENT_CHARS} characters"
            if reason:
                counts.skip(reason)
                continue
            out.write(json.dumps({"text": text, "lang": language}, ensure_ascii=False) + "\n")
            counts.documents += 1
            counts.chars += len(text)
    if os.path.getsize(out.name) == 0:  # every page skipped (and counted): an empty file would be bad input
        os.remove(out.name)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--output", required=True, metavar="DIR", help="writes DIR/<lang>/{manpages,kernel-docs}.jsonl")
    p.add_argument("--languages", nargs="+", metavar="LANG", help="only these (default: every language found)")
    p.add_argument("--max-docs-per-language", type=int, default=1000, help="per source (0: no limit)")
    p.add_argument("--man-root", default=MAN_ROOT)
    p.add_argument(
        "--kernel-docs", nargs="*", metavar="DIR", help="Documentation/translations directories (default: searched)"
    )
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="pages rendered at once")
    args = p.parse_args(argv)
    groff = shutil.which("groff")
    if groff is None:
        print("groff not found: a plain roff reader renders the manual pages (rougher text)", file=sys.stderr)
    kernel_roots = (
        args.kernel_docs
        if args.kernel_docs is not None
        else sorted(d for pattern in KERNEL_DOC_GLOBS for d in glob.glob(pattern))
    )
    sources = [
        ("manpages", man_pages(args.man_root), lambda path: render_man_page(path, groff)),
        ("kernel-docs", kernel_docs(kernel_roots), read_kernel_doc),
    ]
    if not kernel_roots:
        print("no kernel documentation translations found (install linux-doc for them)", file=sys.stderr)
    counts: dict[str, LanguageCounts] = {}
    for kind, by_language, render in sources:
        for language, paths in sorted(by_language.items()):
            if args.languages and language not in args.languages:
                continue
            limited = paths[: args.max_docs_per_language] if args.max_docs_per_language > 0 else paths
            write_language(
                language, kind, limited, render, args.output, args.jobs, counts.setdefault(language, LanguageCounts())
            )
    if not counts:
        print(f"no manual pages or kernel documentation found for {args.languages or 'any language'}", file=sys.stderr)
        return 2
    for language, c in sorted(counts.items()):
        skipped = ", ".join(f"{n} {reason}" for reason, n in sorted(c.skipped.items())) or "none"
        print(f"{language}: {c.documents} documents, {c.chars:,} characters; skipped: {skipped}")
    print(f"wrote {sum(c.documents for c in counts.values())} documents in {len(counts)} languages to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
