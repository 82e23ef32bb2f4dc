#!/usr/bin/env python3
"""Plain English text from the mdBook HTML shipped with the Rust toolchain's documentation.

Source: <sysroot>/share/doc/rust/html/{book,reference,nomicon,edition-guide,cargo,rustc}/,
installed by rustup's `rust-docs` component. Licence: Apache-2.0 OR MIT (the Rust project's
COPYRIGHT file, share/doc/rust/COPYRIGHT.html; none of these books is listed there under another
licence). No download: the files are on every machine with a Rust toolchain.

What is kept: the text of each page's <main> element, page by page in each book's table of
contents order (toc.html), books in the order of --books. What is dropped: <pre> blocks (code
listings and console output: the model is meant to write English, not Rust), scripts, styles,
navigation, the Reference's rule labels (`[items.fn.intro]` links), and pages that are only
redirects. Inline <code> stays as its text, since it is part
of the sentence. Whitespace inside a block is collapsed to single spaces; blocks (paragraphs,
headings, list items, table cells, captions) end with a newline, pages with a blank line.

Split: whole chapters of "The Rust Programming Language" are held out for evaluation (--heldout,
default chapters 16 and 19: concurrency, patterns); everything else is training text. The model,
its tokenizer and its hyperparameters never see the held-out text.

Deterministic: same toolchain docs, same output bytes (the sha256 of each file is printed).
"""

import argparse
import glob
import hashlib
import html.parser
import os
import re
import sys

BOOKS = ["book", "reference", "nomicon", "edition-guide", "cargo", "rustc"]
BLOCK_TAGS = {
    "p", "h1", "h2", "h3", "h4", "h5", "h6", "li", "dt", "dd", "tr", "td", "th",
    "blockquote", "figcaption", "div", "section", "table", "ul", "ol", "dl", "br", "hr",
}
SKIP_TAGS = {"pre", "script", "style", "nav", "svg", "button"}
# Elements that never close (the parser sees no end tag for them).
VOID_TAGS = {"br", "hr", "img", "input", "meta", "link", "wbr", "col", "area", "source"}


def default_docs_dir():
    """The newest-looking toolchain docs: stable first, then any."""
    home = os.path.expanduser("~/.rustup/toolchains")
    for pat in ["stable-*", "*"]:
        for d in sorted(glob.glob(os.path.join(home, pat))):
            html_dir = os.path.join(d, "share/doc/rust/html")
            if os.path.isfile(os.path.join(html_dir, "book/toc.html")):
                return html_dir
    sys.exit("no Rust toolchain docs found under ~/.rustup/toolchains (rustup component add rust-docs)")


class MainText(html.parser.HTMLParser):
    """Collects the text of <main>, skipping SKIP_TAGS, with a newline after each block."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.in_main = 0
        self.skip = 0
        self.blocks = []
        self.cur = []
        self.links = []  # per open <a>: True for the Reference's rule labels ("[items.fn.intro]")

    def flush(self):
        text = re.sub(r"\s+", " ", "".join(self.cur)).strip()
        if text:
            self.blocks.append(text)
        self.cur = []

    def handle_starttag(self, tag, attrs):
        if tag == "main":
            self.in_main += 1
            return
        if not self.in_main or tag in VOID_TAGS and tag not in BLOCK_TAGS:
            return
        if tag == "a":
            rule = "rule-link" in (dict(attrs).get("class") or "").split()
            self.links.append(rule)
            self.skip += rule
        elif tag in SKIP_TAGS:
            self.skip += 1
        elif tag in BLOCK_TAGS and not self.skip:
            self.flush()

    def handle_endtag(self, tag):
        if tag == "main":
            self.flush()
            self.in_main -= 1
            return
        if not self.in_main:
            return
        if tag == "a":
            if self.links and self.links.pop():
                self.skip = max(0, self.skip - 1)
        elif tag in SKIP_TAGS:
            self.skip = max(0, self.skip - 1)
        elif tag in BLOCK_TAGS and not self.skip:
            self.flush()

    def handle_data(self, data):
        if self.in_main and not self.skip:
            self.cur.append(data)


def page_text(path):
    with open(path, encoding="utf-8") as f:
        src = f.read()
    p = MainText()
    p.feed(src)
    p.close()
    return "\n".join(p.blocks)


def toc_pages(book_dir):
    """Pages in table-of-contents order, each once; local .html files only."""
    with open(os.path.join(book_dir, "toc.html"), encoding="utf-8") as f:
        toc = f.read()
    seen, out = set(), []
    for href in re.findall(r'<a href="([^"#:]+\.html)(?:#[^"]*)?"', toc):
        if href in seen or href in ("print.html", "toc.html"):
            continue
        seen.add(href)
        if os.path.isfile(os.path.join(book_dir, href)):
            out.append(href)
    return out


def is_heldout(book, page, chapters):
    m = re.match(r"ch(\d\d)-", page)
    return book == "book" and m is not None and int(m.group(1)) in chapters


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", default=None, help="share/doc/rust/html of a toolchain (default: stable's)")
    ap.add_argument("--books", default=",".join(BOOKS), help="mdBooks to read, in order")
    ap.add_argument("--heldout", default="16,19", help="chapters of 'book' held out for evaluation")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "data"))
    args = ap.parse_args()
    docs = args.docs or default_docs_dir()
    chapters = {int(c) for c in args.heldout.split(",") if c}
    train, heldout, listing = [], [], []
    for book in args.books.split(","):
        book_dir = os.path.join(docs, book)
        for page in toc_pages(book_dir):
            text = page_text(os.path.join(book_dir, page))
            if len(text) < 200:  # redirect stubs and empty section pages
                continue
            split = "heldout" if is_heldout(book, page, chapters) else "train"
            (heldout if split == "heldout" else train).append(text)
            listing.append(f"{split}\t{book}/{page}\t{len(text.encode())}")
    os.makedirs(args.out, exist_ok=True)
    for name, pages in [("train.txt", train), ("heldout.txt", heldout), ("pages.tsv", listing)]:
        data = ("\n\n" if name.endswith(".txt") else "\n").join(pages) + "\n"
        path = os.path.join(args.out, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(data)
        b = data.encode()
        print(f"{path}: {len(b)} bytes, {len(data.split())} words, sha256 {hashlib.sha256(b).hexdigest()[:16]}")
    print(f"docs: {docs}; {len(train)} training pages, {len(heldout)} held-out pages")


if __name__ == "__main__":
    main()
